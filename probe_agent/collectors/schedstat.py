"""How long the training thread ran, and how long it waited for a CPU, in each step.

Linux keeps per-thread scheduler counters in ``/proc/thread-self/schedstat``: nanoseconds on a
CPU, nanoseconds runnable but waiting in a run queue, and time slices. The wait is what a busy
host costs a rank: another process (or too many threads: OpenMP, DataLoader workers, a second
job) on its cores. The straggler verdict needs it to tell "this rank is slow" from "the
scheduler delayed whichever rank it delayed" (a healthy 2-rank job on oversubscribed cores was
named a straggler, a different rank on each run, each time "far beyond chance").

Read on the training thread at each step boundary: one ``pread`` of an fd kept open (~2 us).
A thread waiting in a collective or on I/O sleeps: that is not counted as CPU wait.
"""

from __future__ import annotations

import os
import threading


class ThreadSchedstat:
    """``(on_cpu_s, wait_s)`` of the calling thread since its start, or None off Linux."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._tid: int | None = None
        self.available = os.path.exists("/proc/thread-self/schedstat")

    def read(self) -> tuple[float, float] | None:
        if not self.available:
            return None
        tid = threading.get_ident()
        try:
            if tid != self._tid:  # the fd names the thread that opened it
                self.close()
                self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
                self._tid = tid
            run, wait = os.pread(self._fd, 96, 0).split()[:2]  # type: ignore[arg-type]
            return int(run) * 1e-9, int(wait) * 1e-9
        except (OSError, ValueError):
            self.available = False
            self.close()
            return None

    def close(self) -> None:
        fd, self._fd, self._tid = self._fd, None, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
