"""Run-dir files of one rank (stdlib only; both the agent and the watchdog use it)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RunFiles:
    """Paths under ``run_dir`` for the rank with ``pid``.

    ``sock`` and ``json`` are the public discovery files (``probe PID``, ``probe ps``); the rest
    belong to the watchdog and its agent.
    """

    run_dir: str
    pid: int

    def _p(self, suffix: str) -> str:
        return os.path.join(self.run_dir, f"{self.pid}{suffix}")

    @property
    def sock(self) -> str:
        return self._p(".sock")

    @property
    def json(self) -> str:
        return self._p(".json")

    @property
    def inner_name(self) -> str:
        """The agent's private socket, reached only by its watchdog. Not ``*.sock``: the CLI
        counts ``*.sock`` files to find the one local agent."""
        return f"{self.pid}.agent"

    @property
    def inner(self) -> str:
        return self._p(".agent")

    @property
    def beat(self) -> str:
        return self._p(".beat")

    @property
    def dump(self) -> str:
        """faulthandler output on request (the no-ptrace backtrace route)."""
        return self._p(".dump")

    @property
    def crash(self) -> str:
        """faulthandler output on a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL)."""
        return self._p(".crash")

    @property
    def term(self) -> str:
        """faulthandler output on SIGTERM (chained: the rank still dies of it)."""
        return self._p(".term")

    @property
    def exit_record(self) -> str:
        """What the agent saw at interpreter exit (an uncaught exception, or a plain exit)."""
        return self._p(".exit.json")

    @property
    def watchdog(self) -> str:
        """The watchdog's own record: its pid, the rank's state, the port it holds."""
        return self._p(".watchdog.json")

    @property
    def log(self) -> str:
        return self._p(".watchdog.log")

    def forensic_files(self) -> tuple[str, ...]:
        return (self.beat, self.dump, self.crash, self.term, self.exit_record)
