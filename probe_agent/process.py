"""The process's one agent: start, stop, the hooks of a process that becomes a rank or a
launcher, and the fork handler. The entry points (``probe_agent.start``/``stop``/``log``, the
``PROBE=1`` start-up hook, ``probe inject``'s ``attach``) come through here; this is the only
module that imports agent.py, and no part of the agent imports this one.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from . import patches, roles
from .agent import Agent
from .config import AgentConfig
from .errors import AgentStateError
from .ranks import Identity, publish_rank

log = logging.getLogger(__name__)

_lock = threading.Lock()
_current: Agent | None = None
_fork_handler_registered = False
#: PROBE_AGENT_PID as it was before ``start`` set it (None: unset), put back by ``stop``.
_owner_before: str | None = None


def start(config: AgentConfig | None = None, environ: Mapping[str, str] | None = None) -> Agent:
    """Start the agent in this process; raises ``AgentStateError`` if one already runs."""
    global _current, _fork_handler_registered, _owner_before
    env = os.environ if environ is None else environ
    with _lock:
        if _current is not None and _current.running:
            raise AgentStateError(
                f"a probe agent already runs in this process (rank {_current.rank}, "
                f"{_current.url or _current.unix_path}); call probe_agent.stop() first"
            )
        cfg = config if config is not None else AgentConfig.from_env(env)
        agent = Agent(cfg, Identity.from_env(env))
        agent.start()
        _current = agent
        _owner_before = os.environ.get("PROBE_AGENT_PID")
        os.environ["PROBE_AGENT_PID"] = str(os.getpid())
        publish_rank(agent.identity)
        # init_process_group renumbers it, start_processes makes it a launcher
        roles.arm(after_init=on_group_init, before_spawn=on_start_processes)
        if not _fork_handler_registered:
            # NOTE: forked children (DataLoader workers) must not answer for their parent.
            os.register_at_fork(after_in_child=_after_fork_in_child)
            atexit.register(stop)
            _fork_handler_registered = True
            patches.setting("os.register_at_fork(after_in_child)", "process._after_fork_in_child",
                            by="agent", why="a forked child (DataLoader worker) stops its "
                            "copy of the agent and closes the inherited sockets",
                            restorable=False, why_kept="os.register_at_fork has no unregister; "
                            "with no agent running it does nothing")
            patches.setting("atexit", "probe_agent.stop", by="agent",
                            why="the agent stops (and the post-mortem copy is written) at exit",
                            restorable=False, why_kept="registered once per process; with no "
                            "agent running it does nothing")
        return agent


def stop() -> None:
    global _current
    with _lock:
        agent, _current = _current, None
        if agent is not None:
            _forget_owner()
    if agent is not None:
        agent.stop()


def _forget_owner() -> None:
    """Put PROBE_AGENT_PID back as it was: a process started after the agent stopped has no
    agent above it, and with PROBE=1 must start its own (it would wait for a process group
    otherwise). Only this process's own value is undone (a forked child keeps its parent's)."""
    if os.environ.get("PROBE_AGENT_PID") != str(os.getpid()):
        return
    if _owner_before is None:
        os.environ.pop("PROBE_AGENT_PID", None)
    else:
        os.environ["PROBE_AGENT_PID"] = _owner_before


def current() -> Agent | None:
    """This process's running agent, for programs and tests in the same process. The agent's
    own parts never call it: they are handed what they use (tests/unit/test_import_graph.py
    checks that no part imports this module)."""
    return _current


def start_once(config: AgentConfig, environ: Mapping[str, str]) -> tuple[Agent, bool]:
    """The running agent and False, or a new one started from ``config`` and True
    (``probe inject`` into a process that may already have one)."""
    with _lock:
        agent = _current
    if agent is not None and agent.running:
        return agent, False
    return start(config, environ), True


def log_scalars(step: int | None, scalars: dict[str, Any]) -> None:
    """``probe_agent.log``: into python.metrics when an agent runs, else nothing."""
    agent = _current
    recorder = agent.collectors.steps if agent is not None else None
    if recorder is not None:
        recorder.log(step, scalars)


def on_group_init(rank: int, world: int) -> None:
    """After ``init_process_group`` returned (roles.py): the running agent takes the group's
    identity; a process without one (an ``mp.spawn`` rank under PROBE=1) starts one now."""
    agent = _current
    if agent is not None and agent.running:
        agent.adopt_group(rank, world)
    elif os.environ.get("PROBE", "") not in ("", "0"):
        environ = roles.group_environ(rank, world)
        start(AgentConfig.from_env(environ), environ)


def on_start_processes() -> None:
    """Before ``torch.multiprocessing.start_processes`` from outside a process group
    (roles.py): this process is a launcher, not a rank; its agent stops so the real rank 0
    can bind the base port, and ``<pid>.launcher.json`` tells `probe ps` what it is."""
    agent = _current
    if agent is None or not agent.running:
        return
    if agent.config.unix_socket:
        roles.write_launcher_record(agent.config.run_dir, agent.identity.pid,
                                    agent.identity.host)
    log.info("probe agent: pid %d starts ranks with torch.multiprocessing: it is a launcher, "
             "not rank %d; its agent stops", os.getpid(), agent.rank)
    stop()


def _after_fork_in_child() -> None:
    global _current
    agent, _current = _current, None
    if agent is None:
        return
    agent.running = False  # its threads do not exist in the child; nothing to join
    if agent._server is not None:
        agent._server.close_sockets()
    if agent.watchdog is not None:
        agent.watchdog.after_fork_in_child()
    if agent.postmortem is not None:
        agent.postmortem.after_fork_in_child()
