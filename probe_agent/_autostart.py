"""``PROBE=1`` auto-start, called from the ``probe_autostart.pth`` line at interpreter start-up.

The .pth line itself only reads ``os.environ`` (already imported by ``site``), so with PROBE
unset it costs one dict lookup. With PROBE set, ``decide`` sorts the process:

- ``NO``: a launcher (torchrun / ``torch.distributed.run|launch``, deepspeed's launchers,
  ``accelerate launch``, torch.compile's compile workers, the probe CLI, pip). They start ranks
  or serve them; they are not ranks.
- ``START``: a rank, started at once. Either no agent runs above it (``PROBE_AGENT_PID`` is not
  inherited: torchrun's workers, ``python train.py``), or it was given a rank identity of its own
  (RANK / LOCAL_RANK that differ from the agent above it: Lightning's subprocess launcher starts
  rank N as ``python train.py`` with ``LOCAL_RANK=N``).
- ``DEFER``: everything else below an agent, and every multiprocessing spawn/forkserver child:
  ``mp.spawn`` ranks, spawn DataLoader workers, a rank's subprocesses. Nothing starts now; once
  the program imports torch, ``roles.DistHooks`` wraps ``init_process_group``, and the agent
  starts when (if ever) the process joins a process group. Workers never do.
A failure to start prints one line on stderr; the training program always runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

#: ``python -m X`` launchers and console scripts that start ranks but are not ranks.
LAUNCHER_MODULES = frozenset(
    {
        "torch.distributed.run",
        "torch.distributed.launch",
        "torch._inductor.compile_worker",
        "torch._inductor.compile_worker.__main__",
        "deepspeed.launcher.runner",
        "deepspeed.launcher.launch",
        # accelerate launch runs torch.distributed.run in its own process (multi_gpu_launcher)
        "accelerate.commands.launch",
        "probe_cli",
        "pip",
    }
)
LAUNCHER_SCRIPTS = frozenset({"torchrun", "deepspeed", "ds", "accelerate-launch", "probe",
                              "pip", "pip3"})
COMPILE_WORKER_SCRIPT = "torch/_inductor/compile_worker/__main__.py"
#: Console scripts that are launchers with one subcommand only (``accelerate launch``).
LAUNCHER_SUBCOMMANDS = {"accelerate": "launch"}

START, DEFER, NO = "start", "defer", "no"


def decide(argv: list[str], environ: Mapping[str, str], pid: int) -> str:
    """START, DEFER or NO for a process with this command line and environment (see module)."""
    kind, what, rest = _program(argv[1:])
    if kind == "-m" and what in LAUNCHER_MODULES:
        return NO
    if kind == "script":
        script = os.path.basename(what)
        if script in LAUNCHER_SCRIPTS or (rest and LAUNCHER_SUBCOMMANDS.get(script) == rest[0]):
            return NO
        if what.endswith(COMPILE_WORKER_SCRIPT):  # inductor runs its worker pool by path
            return NO
    # A spawn child's environment is its parent's, copied: a RANK in it is not its own.
    if "--multiprocessing-fork" in rest or (kind == "-c" and "multiprocessing" in what):
        return DEFER
    owner = environ.get("PROBE_AGENT_PID")
    if not owner or owner == str(pid):
        return START
    return START if has_own_rank(environ) else DEFER


#: Interpreter options that take the next argument (``python -X dev -W error -m x``).
_OPTIONS_WITH_VALUE = frozenset({"-X", "-W", "--check-hash-based-pycs"})
#: Single-letter interpreter flags that take no value (they can run together: ``-Bu``).
_FLAGS = frozenset("bBdEiIOPqsSuvx")


def _program(args: list[str]) -> tuple[str, str, list[str]]:
    """``("-m", module, rest)``, ``("-c", code, rest)``, ``("script", path, rest)`` or
    ``("", "", [])``, past interpreter options: deepspeed runs ``python -u -m
    deepspeed.launcher.launch``, multiprocessing ``python -B -c ...``."""
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-m", "-c") or (len(a) > 2 and a[0] == "-" and a[-1] in "mc"
                                 and set(a[1:-1]) <= _FLAGS):
            flag = "-" + a[-1]  # -m, -c, or flags run together: -um, -Bc
            if i + 1 < len(args):
                return flag, args[i + 1], args[i + 2:]
            return "", "", []
        if a in _OPTIONS_WITH_VALUE:
            i += 2
        elif a.startswith("-") and a != "-":
            i += 1
        else:
            return "script", a, args[i + 1:]
    return "", "", []


#: settings.RANK_VARS and settings.LOCAL_RANK_VARS, repeated so that a deferred process does
#: not import settings (the package, errors, dataclasses: ~20 ms) at start-up; a unit test pins
#: them equal.
RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")


def has_own_rank(environ: Mapping[str, str]) -> bool:
    """Whether RANK or LOCAL_RANK (or their srun / Open MPI names) is set and differs from the
    rank of the agent above this process (``PROBE_AGENT_RANK`` = ``rank:local_rank``, which the
    agent keeps up to date). Lightning's own rank 0 sets ``LOCAL_RANK=0`` in its environment
    after its agent started: its DataLoader workers inherit that, and are not new ranks."""
    try:
        parent = [int(x) for x in environ.get("PROBE_AGENT_RANK", "0:0").split(":")]
    except ValueError:
        parent = [0, 0]
    for names, theirs in ((RANK_VARS, parent[0]), (LOCAL_RANK_VARS, parent[-1])):
        for name in names:
            raw = environ.get(name, "").strip()
            if raw:
                try:
                    if int(raw) != theirs:
                        return True
                except ValueError:
                    pass
                break
    return False


def should_start(argv: list[str], environ: Mapping[str, str], pid: int) -> bool:
    """Whether a process with this command line and environment starts an agent at once."""
    return decide(argv, environ, pid) == START


_attempted = False


def maybe_start() -> None:
    global _attempted
    # site can process the same site-packages twice (a venv over a pyenv interpreter does):
    # only the first call may start.
    if _attempted:
        return
    _attempted = True
    argv = list(getattr(sys, "orig_argv", sys.argv))
    try:
        what = decide(argv, os.environ, os.getpid())
        if what == DEFER:
            from .roles import arm

            # The agent's handlers load probe_agent.process only when a hook fires: a deferred
            # process (every DataLoader worker) must not pay for config and ssl at start-up.
            arm(after_init=_on_group_init, before_spawn=_on_start_processes)
        elif what == START:
            from .process import start

            start()
    except Exception as e:  # never keep the training program from running
        sys.stderr.write(f"probe: agent not started: {e}\n")


def _on_group_init(rank: int, world: int) -> None:
    from .process import on_group_init  # lazy: see maybe_start

    on_group_init(rank, world)


def _on_start_processes() -> None:
    from .process import on_start_processes  # lazy: see maybe_start

    on_start_processes()
