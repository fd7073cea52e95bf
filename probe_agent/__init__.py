"""probe agent: lives inside a training rank and answers query, eval and backtrace over HTTP.

``import probe_agent`` is free: nothing heavy (duckdb, fastapi, torch) is imported and nothing
starts until ``start()`` is called, or the process runs with ``PROBE=1``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ._version import __version__

__all__ = ["__version__", "log", "start", "stop"]

if TYPE_CHECKING:
    from .agent import Agent
    from .config import AgentConfig


def start(config: AgentConfig | None = None) -> Agent:
    """Start the agent in this process, configured from ``PROBE_*`` variables unless ``config``
    is given. Binds its sockets before returning: a taken port raises ``BindError`` here."""
    from .process import start as _start

    return _start(config)


def stop() -> None:
    """Stop the agent if one runs; idempotent."""
    from .process import stop as _stop

    _stop()


def log(step: int | None = None, **scalars: Any) -> None:
    """Record scalars (``loss=…``, ``grad_norm=…``) into ``python.metrics`` for ``step``.

    Free to call when no agent runs (it returns at once) and never raises. ``step`` defaults to
    the last finished optimizer step, so call it after ``optimizer.step()`` or pass ``step=``.
    Tensors are fine: they are converted on the agent's writer thread, so this never waits for
    the GPU. ``samples=N`` also fills ``python.steps.samples_per_s``.
    """
    # No agent was ever started while probe_agent.process is not loaded: return without loading
    # it (and config, ssl with it) into a program that only logs.
    agent_mod = sys.modules.get("probe_agent.process")
    if agent_mod is not None:
        agent_mod.log_scalars(step, scalars)


def __getattr__(name: str) -> Any:  # pragma: no cover - convenience for REPL users
    raise AttributeError(f"module 'probe_agent' has no attribute {name!r}")
