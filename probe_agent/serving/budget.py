"""ServeBudget: the CPU the agent may spend answering requests (PROBE_SERVE_CPU).

Every request the agent serves runs Python in the training process, and Python needs the GIL
the training thread needs too. Measured on the load bench (50 clients, ~50 requests/s against
a ~17 ms step): ~5 ms of agent CPU per request, a quarter of a core, and the step time up by a
third. No single request is slow; the crowd is the cost. So the agent keeps its serving
threads to a share of one core, as a token bucket:

- tokens are seconds of CPU; they refill at ``share`` per second of wall time, up to
  ``burst_s`` (an on-call engineer's first requests never wait);
- before a request is handled, the CPU its serving threads used since the last look is taken
  out (``time.pthread_getcpuclockid``: their own CPU, not the training threads' or torch's);
- while the bucket, less what the requests in flight will cost at the mean so far, is empty,
  requests wait, one admission at a time, in arrival order (asyncio.Lock is FIFO). Nothing is
  refused or lost; the wait shows up as latency and in the ``X-Probe-Queued-Ms`` header.

A request's CPU is known only after it ran, so the share holds on average, not per request.

Bytes as well as CPU: four clients pulling 100 MB results slowed training by 69%
with PROBE_SERVE_CPU at its default. Two reasons. A request found the bucket empty only while
another was in flight, so one-at-a-time requests were never held back; now a request waits
whenever the bucket is in debt, but with nothing else in flight at most ``LONE_WAIT_S`` (an
operator's next command after a heavy query must not hit the CLI's timeout). Back-to-back
heavy requests thus get at most one per ``LONE_WAIT_S`` plus their own cost. And much of a
big reply's cost is not the agent's CPU: the kernel's copies and the client's decoding on a
shared machine. So each reply's bytes are charged (``BYTE_COST_S`` each) before it is sent.
"""

from __future__ import annotations

import asyncio
import threading
import time

#: Threads whose CPU is the cost of serving: uvicorn's loops, the query and eval pools, the
#: eval thread. The writer, the rank registry and the heartbeat run whether or not anyone asks.
SERVING_PREFIXES = ("probe-agent.http", "probe-agent.query", "probe-agent.sql",
                    "probe-agent.eval")
#: Budget seconds per reply byte: 10 ns, so a reply at the 16 MiB PROBE_MAX_RESULT_BYTES cap
#: costs 0.17 s, and at the default 2% share big replies flow at ~2 MB/s on average.
BYTE_COST_S = 1e-8
#: Longest a request waits for the bucket's debt when no other request is in flight.
LONE_WAIT_S = 2.0


class ServeBudget:
    """Token bucket over the serving threads' CPU; ``share`` ≥ 1 turns it off."""

    def __init__(self, share: float, burst_s: float = 1.0) -> None:
        self.share = share
        self.burst_s = burst_s
        self.enabled = share < 1.0
        self.tokens = burst_s
        self.waited_s = 0.0  # total time requests spent queued (GET /v1/info reports it)
        self._last = time.monotonic()
        self._seen: dict[int, float] = {}  # thread ident -> its CPU seconds when last read
        self._first = True
        self.inflight = 0  # admitted, not finished
        self.finished = 0
        self.used_s = 0.0  # serving CPU measured so far (the mean cost per request)
        self._lock = asyncio.Lock()

    def cpu_since_last(self) -> float:
        """CPU seconds the serving threads used since the last call (a thread seen for the
        first time counts from its start, except at the very first call: agent start-up)."""
        first = self._first
        self._first = False
        used, alive = 0.0, set()
        for t in threading.enumerate():
            if t.ident is None or not t.name.startswith(SERVING_PREFIXES):
                continue
            try:
                cpu = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, ProcessLookupError):  # the thread ended just now
                continue
            alive.add(t.ident)
            prev = self._seen.get(t.ident, cpu if first else 0.0)
            used += max(0.0, cpu - prev)
            self._seen[t.ident] = cpu
        for ident in set(self._seen) - alive:
            del self._seen[ident]
        return used

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst_s, self.tokens + (now - self._last) * self.share)
        self._last = now
        used = self.cpu_since_last()
        self.used_s += used
        self.tokens = max(-self.burst_s, self.tokens - used)

    def charge_bytes(self, nbytes: int) -> None:
        """Take a reply's ``nbytes`` out of the bucket before it is sent (the next request
        waits for them; this one is already running)."""
        if self.enabled:
            self.tokens = max(-self.burst_s, self.tokens - nbytes * BYTE_COST_S)

    def _owed(self) -> float:
        """What the requests admitted but not finished will cost, at the mean so far."""
        return self.inflight * self.used_s / max(1, self.finished) if self.finished else 0.0

    async def admit(self) -> float:
        """Wait until the bucket allows one more request; returns the seconds waited. Every
        admit must be followed by ``done()``."""
        t0 = time.monotonic()
        if self.enabled:
            async with self._lock:
                self._refill()
                # Requests already admitted have not been charged yet (their CPU is measured
                # after they ran): count them at the mean cost, or a burst of arrivals would
                # all pass on one full bucket. A bucket in debt holds a request even when
                # nothing else is in flight, for up to LONE_WAIT_S (else
                # back-to-back requests were free).
                while self.tokens - self._owed() < 0:
                    if not self.inflight and time.monotonic() - t0 >= LONE_WAIT_S:
                        break
                    await asyncio.sleep(min(0.5, max(0.005, (self._owed() - self.tokens)
                                                     / self.share)))
                    self._refill()
        self.inflight += 1
        waited = time.monotonic() - t0
        self.waited_s += waited
        return waited

    def done(self) -> None:
        self.inflight -= 1
        self.finished += 1
