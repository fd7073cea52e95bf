"""ServingFootprint: the resident memory the agent keeps after answering requests.

A healthy rank polled by `probe doctor` every 12 s (or by the dashboard) grew ~50 MiB of RSS
over its first 1000 steps, then went flat, and once a healthy rank was named for MEMORY GROWTH.
That memory was the agent's: query execution, Arrow results and the allocator arenas of the
serving threads. DuckDB's own accounting (``agent_mib``) does not see it. So the RSS change over
every busy period (from the first request in flight to the last one done) is added up, signed:
memory that serving takes and gives back nets to nothing; memory it keeps is the agent's.

The training thread allocates during a busy period too. A period that lasts longer than
``MAX_PERIOD_S`` is mostly the agent waiting (a profile window, a flame session, an action
waiting for its step), and its RSS change is mostly the job's: it is not counted, so a busy
dashboard cannot hide a real leak. Requests arrive on the event loop thread only: no lock.
"""

from __future__ import annotations

import os
import time

_MIB = 1.0 / (1 << 20)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: Busy periods longer than this are not charged to the agent (see above).
MAX_PERIOD_S = 2.0


class ServingFootprint:
    """Net RSS growth over the agent's short busy periods; ``growth_mib`` is the total."""

    def __init__(self) -> None:
        self.inflight = 0
        self.growth_mib = 0.0
        self.periods = 0
        self._start: tuple[float, float] | None = None  # (monotonic, rss MiB)
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:  # not Linux: nothing is charged
            self._fd = None

    def rss_mib(self) -> float | None:
        if self._fd is None:
            return None
        try:
            return int(os.pread(self._fd, 128, 0).split()[1]) * _PAGE * _MIB
        except (OSError, ValueError, IndexError):
            return None

    def enter(self) -> None:
        self.inflight += 1
        if self.inflight == 1:
            rss = self.rss_mib()
            self._start = None if rss is None else (time.monotonic(), rss)

    def exit(self) -> None:
        self.inflight -= 1
        if self.inflight > 0 or self._start is None:
            return
        t0, rss0 = self._start
        self._start = None
        rss = self.rss_mib()
        if rss is None or time.monotonic() - t0 > MAX_PERIOD_S:
            return
        self.growth_mib += rss - rss0
        self.periods += 1

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
