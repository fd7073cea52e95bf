"""Is the watchdog serving? Run inside the rank, on the ``probe-agent.watchdog`` thread, between
heartbeats: never blocking (the heartbeat must keep its 0.25 s beat).

The agent restarted a watchdog only once it had died. One that is alive but does not serve, a
``kill -STOP`` (or a ``^Z`` of it alone), or an event loop stuck for good, held the public
sockets and made the rank unreachable: every request waited in its backlog. Two signs:

- ``/proc/<pid>/stat`` state ``T`` (stopped by a signal) for STOPPED_S: taken over;
- no answer to ``GET /v1/health?challenge=...`` (which the watchdog answers itself, not the
  agent) on its own unix socket within HUNG_S, asked every PROBE_EVERY_S: taken over.

Taking over is the restart a death gets (watchdog_restarts.py): the watchdog is killed
(SIGKILL ends a stopped process too) and a new one serves the same sockets. A watchdog stopped
by a debugger (state ``t``: someone is tracing it) is left alone and reported
(``debugger_stop``); killing it would end that person's session.
"""

from __future__ import annotations

import socket
import time

#: A watchdog stopped by a signal this long is replaced (a SIGCONT within it is forgiven).
STOPPED_S = 5.0
#: How often its own health answer is asked for, and how long it may take before the watchdog
#: counts as hung (its event loop answers in milliseconds; generous for a loaded machine).
PROBE_EVERY_S = 5.0
HUNG_S = 15.0


def proc_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from /proc (R, S, D, T, t, Z...), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ')'.
    rest = data.rpartition(b")")[2].split()
    return rest[0].decode() if rest else None


class WatchdogCheck:
    """One watchdog process's checks; ``tick()`` says why to take over, or None.

    Args:
        pid: the watchdog's pid.
        uds_path: its public unix socket (the agent's own listening copy's address).
    """

    def __init__(self, pid: int, uds_path: str | None) -> None:
        self.pid = pid
        self.uds_path = uds_path
        self.debugger_stop = False
        self._stopped_since: float | None = None
        self._sock: socket.socket | None = None
        self._sent_at = 0.0
        self._next_probe = time.monotonic() + PROBE_EVERY_S
        self._got = b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def tick(self) -> str | None:
        now = time.monotonic()
        state = proc_state(self.pid)
        self.debugger_stop = state == "t"
        if state == "T":
            self._stopped_since = self._stopped_since or now
            if now - self._stopped_since >= STOPPED_S:
                self.close()
                return (f"stopped (SIGSTOP, /proc state T) for {now - self._stopped_since:.0f} "
                        "s, holding the rank's sockets")
            return None
        self._stopped_since = None
        if state in ("t", None, "Z", "X"):
            self.close()  # traced, or gone: the death itself is seen by the waiter
            return None
        return self._probe(now)

    def _probe(self, now: float) -> str | None:
        if self.uds_path is None:
            return None
        if self._sock is None:
            if now >= self._next_probe:
                self._ask(now)
            return None
        try:
            chunk = self._sock.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            chunk = None
        except OSError:
            chunk = b""
        if chunk is None:
            if now - self._sent_at < HUNG_S:
                return None
            self.close()
            return f"did not answer a health check for {now - self._sent_at:.0f} s (hung)"
        self._got += chunk
        if chunk == b"" or b"\r\n\r\n" in self._got:
            self.close()  # answered (or closed on us: alive enough to do that)
            self._next_probe = now + PROBE_EVERY_S
        return None

    def _ask(self, now: float) -> None:
        sock = socket.socket(socket.AF_UNIX)
        sock.setblocking(False)
        try:
            sock.connect(self.uds_path or "")
            sock.send(b"GET /v1/health?challenge=watchdog-check HTTP/1.1\r\nHost: localhost\r\n"
                      b"Connection: close\r\n\r\n")
        except OSError:
            sock.close()  # no socket there (stopping), or a full backlog: ask again later
            self._next_probe = now + PROBE_EVERY_S
            return
        self._sock, self._sent_at, self._got = sock, now, b""
