"""Restarting a dead watchdog (runs inside the rank, on the ``probe-agent.watchdog`` thread).

A watchdog can die while its rank lives: a stray ``kill -9``, the OOM killer picking the small
process, a bug of ours. The agent used to serve the public sockets itself, which
loses the out-of-process backtrace for the rest of the job, exactly when a later hang needs it.
Now ``supervise`` starts a new one on the same listening sockets (the agent kept its copies, so
connections that arrive meanwhile wait in the backlog): at once the first time, then after a
doubling backoff. A watchdog stopped on purpose (SIGTERM: ``DELIBERATE``) is not restarted:
the agent serves its sockets in-process. ``Restarts`` keeps the count and the last cause for
``probe info``. A watchdog that dies MAX_RESTARTS times within RESTART_WINDOW_S is broken, not
unlucky: the agent gives up and serves in-process, as before. A watchdog that lives but does
not serve (stopped by SIGSTOP, or hung: watchdog_check.py) is killed and restarted the same way.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import weakref
from typing import Any

from ..watchdog import beat

#: Restarts allowed within RESTART_WINDOW_S before the agent serves its sockets in-process.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 300.0
#: The wait before the n-th restart within the window is RESTART_BACKOFF_S * 2**(n-2), the first
#: at once: the operator's next request should find a watchdog, a crash loop should not spin.
RESTART_BACKOFF_S = 0.5


#: Deaths that are a stop on purpose, never restarted: the watchdog's SIGTERM handler exits 0,
#: and a SIGTERM that arrives before the handler is installed kills it.
DELIBERATE = frozenset({"exited with status 0", "killed by SIGTERM"})


def death_cause(code: int) -> str:
    """``killed by SIGKILL`` / ``exited with status 1`` from a Popen return code."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class Restarts:
    """The watchdog's deaths and restarts, as ``describe()`` reports them."""

    def __init__(self) -> None:
        self._deaths: list[float] = []  # monotonic, within the last RESTART_WINDOW_S
        self.count = 0
        self.last_death: str | None = None
        self.last_death_at: float | None = None
        self.gave_up = False

    def died(self, why: str) -> float | None:
        """Record a death: the seconds to wait before the next restart, or None when it has
        died too often (``gave_up`` is then set)."""
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < RESTART_WINDOW_S] + [now]
        self.last_death, self.last_death_at = why, time.time()
        if len(self._deaths) > MAX_RESTARTS:
            self.gave_up = True
            return None
        n = len(self._deaths)
        return 0.0 if n == 1 else RESTART_BACKOFF_S * 2 ** (n - 2)

    @property
    def recent(self) -> int:
        return len(self._deaths)

    def describe(self) -> dict[str, Any]:
        return {"restarts": self.count, "last_death": self.last_death,
                "last_death_at": self.last_death_at, "gave_up": self.gave_up}


def supervise(proc: subprocess.Popen[bytes] | None, link: weakref.ref[Any],
              stop: threading.Event) -> None:
    """Wait on the watchdog ``proc``, writing the rank's heartbeat meanwhile; when it dies, ask
    the link for a delay and a new one. Ends when ``stop`` is set.

    The link is held only between waits, never across one: at interpreter exit it must not
    keep the link alive (see the NOTE in ``WatchdogLink.start``).
    """
    why = None
    while True:
        if proc is not None:
            why = _wait_beating(proc, link, stop)
        alive = link()
        if alive is None or why is None:
            return
        delay = alive._watchdog_exited(why)
        del alive
        if delay is None or stop.wait(delay):
            return
        alive = link()
        if alive is None:
            return
        proc, why = alive._respawn()
        del alive
        if proc is None and why is None:
            return


def _wait_beating(proc: subprocess.Popen[bytes], link: weakref.ref[Any],
                  stop: threading.Event) -> str | None:
    """``proc``'s death cause once it ends; meanwhile the link's heartbeat every
    ``beat.INTERVAL_S`` (one thread for both: the heartbeat had a thread of its own). None once
    ``stop`` is set or the link is gone."""
    while True:
        try:
            return death_cause(proc.wait(beat.INTERVAL_S))
        except subprocess.TimeoutExpired:
            pass
        if stop.is_set():
            return None
        alive = link()
        if alive is None:
            return None
        alive.heartbeat()
        why = alive.check_watchdog(proc)  # alive but not serving (watchdog_check.py)?
        del alive
        if why is not None:
            proc.kill()  # SIGKILL ends a stopped process too; its sockets are ours as well
            proc.wait()
            return why
