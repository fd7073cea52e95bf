"""Whether this process is a rank or a launcher, decided by what it does with torch.

At start-up ``_autostart.decide`` sorts processes by their command line and environment. Two
kinds cannot be told apart there, only later by what they call:

- An ``mp.spawn`` rank has no rank in its environment; it looks like a DataLoader worker until
  it calls ``init_process_group``. ``DistHooks`` wraps that function once the program has
  imported torch (never before, never by importing it): when it returns, a process without an
  agent starts one with the group's rank and world size (``agent.on_group_init``), and a process
  with one takes the group's identity (``Agent.adopt_group``: Lightning's rank 0 starts with no
  RANK at all). DataLoader and compile workers never call it, so they never carry an agent.
  Forked ranks (``start_processes(start_method="fork")``) inherit the wrapper and start theirs
  the same way; the parent's agent was already dropped in the child at fork.
- The process that calls ``torch.multiprocessing.start_processes`` (``mp.spawn`` calls it; so
  does Lightning's ``ddp_spawn``) while not in a process group itself is a launcher: it stops
  its agent before its children start, so it neither answers as rank 0 nor keeps the base
  port that the real rank 0 binds, and leaves ``<run_dir>/<pid>.launcher.json`` for `probe ps`.
  Lightning's default DDP launcher starts ranks with ``subprocess`` instead, from the process
  that then becomes rank 0 itself: that one stays a rank.

Wrapping keeps ``functools.wraps`` metadata, and every failure of ours is caught: the program's
own call always runs and returns as it would have.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# Only os and sys at import: every deferred process (spawn DataLoader workers too) loads this
# module at start-up. The rest is imported when torch is.
_armed = False
#: What runs after ``init_process_group`` returns (with the group's rank and world size) and
#: before ``start_processes`` starts children: the agent's process-level handlers, given to
#: ``arm`` (agent.py). The wrappers are process-wide, so these are too.
_after_init_hook: Any = None
_before_spawn_hook: Any = None


def arm(after_init: Any, before_spawn: Any) -> None:
    """Install the hooks now if the program has imported torch, else right after it does.
    Idempotent; never imports torch. Called at start-up (one thread) or from agent.start().

    Args:
        after_init: ``(rank, world_size) -> None``, after ``init_process_group`` returns.
        before_spawn: ``() -> None``, before ``start_processes`` starts the children.
    """
    global _armed, _after_init_hook, _before_spawn_hook
    if _armed:
        return
    _armed = True
    _after_init_hook, _before_spawn_hook = after_init, before_spawn
    # Imported here, not at the top: see the note above (start-up cost of every process).
    from .collectors.torch_import import TorchImportWatcher, imported

    if imported("torch") is not None:
        install()
    else:
        TorchImportWatcher(install).install()


def install() -> None:
    """Wrap ``init_process_group`` and ``start_processes`` wherever torch has bound them."""
    try:
        _wrap("torch.distributed.distributed_c10d", "init_process_group", "torch.distributed",
              _after_init)
        _wrap("torch.multiprocessing.spawn", "start_processes", "torch.multiprocessing",
              _before_start_processes, before=True)
    except Exception as e:  # a torch without these names: ranks still start from the env
        _log().warning("probe agent: cannot watch init_process_group / start_processes: %s", e)


def _log() -> Any:
    import logging

    return logging.getLogger(__name__)


def _wrap(home: str, name: str, prefix: str, hook: Any, before: bool = False) -> None:
    import functools

    from . import patches

    mod = sys.modules.get(home)
    original = getattr(mod, name, None)
    if original is None or patches.ours(original) is not None:
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before:
            _quietly(hook)
        result = original(*args, **kwargs)
        if not before:
            _quietly(hook)
        return result

    # Every module that bound the function at import (torch.distributed re-exports it,
    # device_mesh imports it by name) gets the wrapper, so each way of calling it is seen.
    for mod_name, module in list(sys.modules.items()):
        if mod_name.startswith(prefix) and getattr(module, name, None) is original:
            patches.replace(
                module, name, wrapper, by="roles",
                why=("takes the rank the process group gives (the agent's rows carry it)"
                     if not before else "stops the agent of a process that starts ranks with "
                     "torch.multiprocessing: a launcher, not a rank"),
                restorable=False,
                why_kept="armed once per process: an agent started later (re-injection, "
                "start after stop) learns its rank from it; with no agent it only calls through")


def _quietly(hook: Any) -> None:
    try:
        hook()
    except Exception as e:  # never into the training program's own call
        sys.stderr.write(f"probe: agent not started: {e}\n")


def _after_init() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        return
    _after_init_hook(dist.get_rank(), dist.get_world_size())


def _before_start_processes() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_initialized():
        return  # a rank that starts helper processes stays a rank
    _before_spawn_hook()


def group_environ(rank: int, world: int) -> dict[str, str]:
    """The environment of rank ``rank`` of ``world``, for an agent started after
    ``init_process_group``: its port is the base plus LOCAL_RANK, or plus ``rank`` when no
    launcher set LOCAL_RANK (``mp.spawn`` on one node)."""
    from .settings import LOCAL_RANK_VARS, first_set

    environ = dict(os.environ)
    local_var = first_set(environ, LOCAL_RANK_VARS)
    if not environ.get(local_var, "").strip():
        environ["LOCAL_RANK"] = str(rank)
    environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    return environ


def write_launcher_record(run_dir: str, pid: int, host: str) -> None:
    """``<run_dir>/<pid>.launcher.json``: `probe ps` shows the process as a launcher. The run
    dir's sweep removes it once the process is gone, like every ``<pid>.*`` file."""
    import atexit
    import time

    from probe_protocol.runfiles import RunFiles

    from .rundir import write_record

    path = RunFiles(run_dir, pid).launcher
    record = {"pid": pid, "role": "launcher", "host": host,
              "argv": sys.argv[:8], "since": time.time()}
    try:
        write_record(path, record)
        atexit.register(_unlink, path)
        from . import patches

        patches.setting("atexit", f"remove {path}", by="roles",
                        why="the launcher's record goes when the launcher exits",
                        restorable=False, why_kept="it removes the record at exit")
    except OSError as e:
        _log().warning("probe agent: could not write %s: %s", path, e)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
