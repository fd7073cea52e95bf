"""Deadlines: one thread that interrupts queries running past PROBE_QUERY_TIMEOUT_MS.

A ``threading.Timer`` per query started (and tore down) an OS thread for every query: about a
third of a millisecond of CPU each, in the training process, for a timer that almost never fires.
Here one thread sleeps until the earliest deadline, and ends after IDLE_S with none armed.

The interrupt is called with the lock held, and ``disarm`` takes the lock: once ``disarm``
returns, that deadline can no longer fire, so a reused cursor's next query is never hit by the
previous query's timer.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: Seconds without an armed deadline after which the thread ends (a quiet agent keeps none).
#: Shorter than the post-mortem copy's 10 s period, whose reads would otherwise keep it for
#: good; a new thread costs ~0.3 ms of CPU, once per quiet spell.
IDLE_S = 2.0


class Deadlines:
    def __init__(self, name: str = "probe-agent.deadlines", idle_s: float = IDLE_S) -> None:
        self._name = name
        self._idle_s = idle_s
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._live: set[int] = set()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def arm(self, seconds: float, fn: Callable[[], None]) -> int:
        """Call ``fn`` in ``seconds`` unless disarmed first; returns the token for ``disarm``."""
        with self._cond:
            token = next(self._ids)
            heapq.heappush(self._heap, (time.monotonic() + seconds, token, fn))
            self._live.add(token)
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
            return token

    def disarm(self, token: int) -> None:
        with self._cond:
            self._live.discard(token)
            if self._heap and self._heap[0][1] == token:
                # the thread sleeps until this one's due time: wake it to start its idle wait
                self._cond.notify()

    @contextmanager
    def on_cpu_time(self, seconds: float, wall_s: float, fn: Callable[[], None]
                    ) -> Iterator[None]:
        """Call ``fn`` once the calling thread has used ``seconds`` of CPU time inside the
        block, or ``wall_s`` have passed, unless the block ended first: the deadline of a thread
        that yields the CPU to training (cpu_priority.py), which may wait for the CPU long."""
        clock = time.pthread_getcpuclockid(threading.get_ident())
        cpu0, wall_end = time.clock_gettime(clock), time.monotonic() + wall_s
        token, done = [0], [False]

        def check() -> None:  # on our thread, under the lock (arm re-enters it: an RLock)
            if done[0]:
                return  # re-armed just as the block ended: the cursor's next query is not ours
            left = seconds - (time.clock_gettime(clock) - cpu0)
            if left <= 0 or time.monotonic() >= wall_end:
                fn()
            else:
                token[0] = self.arm(min(max(left, 0.05), wall_end - time.monotonic()), check)

        token[0] = self.arm(min(seconds, wall_s), check)
        try:
            yield
        finally:
            done[0] = True
            self.disarm(token[0])

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(2.0)

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)  # disarmed: drop without waiting for it
                if not self._heap:
                    # Nothing armed for IDLE_S: end; the next arm() starts a thread again.
                    if not self._cond.wait(self._idle_s) and not self._heap:
                        self._thread = None
                        return
                    continue
                due, token, fn = self._heap[0]
                now = time.monotonic()
                if due > now:
                    self._cond.wait(due - now)
                    continue
                heapq.heappop(self._heap)
                self._live.discard(token)
                try:
                    fn()
                except Exception:  # an interrupt of a closed cursor: nothing left to stop
                    pass
