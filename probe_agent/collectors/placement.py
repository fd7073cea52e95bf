"""Where the training thread runs: which machine, which CPUs it may use, how loaded they are.

The straggler verdict needs it to tell "this rank's cores are busy" from "the ranks share cores
and the scheduler picked one to wait": two ranks on one machine with no CPU pinning share every
core, so which one waits more in the run queue is the scheduler's choice from one window to the
next, not something about that rank (a healthy 2-rank job at load 7 on 2 cores had rank 0 named
a straggler because it "waited for a CPU 43% of its step time").

- machine: the kernel's boot id (``/proc/sys/kernel/random/boot_id``). Containers on one kernel
  share its CPUs and its boot id while their host names differ; two machines never share one.
  The host name where there is no boot id (not Linux).
- CPUs: ``os.sched_getaffinity(0)`` on the training thread (affinity is per thread: a script
  that pins its main thread after the agent started changes only that thread's), in the kernel's
  CPU-list form (``0-3,8``), as ``taskset -c`` and ``Cpus_allowed_list`` write it.
- load: the 1-minute load average (runnable and uninterruptible threads of the whole machine).

Read on the training thread at a step boundary, at most once a second (two syscalls, ~5 us);
steps in between carry the last reading.
"""

from __future__ import annotations

import os
import socket
import time

from probe_protocol.cpulist import cpu_list

#: Seconds between two readings: affinity and load change on that scale, if at all.
READ_EVERY_S = 1.0


def machine_id() -> str:
    """The kernel's boot id, else the host name."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        if boot:
            return boot
    except OSError:
        pass
    return socket.gethostname()


class Placement:
    """``(boot_id, cpu_affinity, load_1m)`` of the calling thread, refreshed once a second."""

    def __init__(self) -> None:
        self.boot_id = machine_id()
        self._at = -READ_EVERY_S
        self._cpus: frozenset[int] | None = None
        self._last: tuple[str, str | None, float | None] = (self.boot_id, None, None)

    def read(self) -> tuple[str, str | None, float | None]:
        now = time.monotonic()
        if now - self._at < READ_EVERY_S:
            return self._last
        self._at = now
        affinity, load = self._last[1], None
        try:
            cpus = frozenset(os.sched_getaffinity(0))
            if cpus != self._cpus:  # the string is built only when the set changed
                self._cpus, affinity = cpus, cpu_list(cpus)
        except (AttributeError, OSError):  # not Linux
            affinity = None
        try:
            load = round(os.getloadavg()[0], 2)
        except (AttributeError, OSError):
            load = None
        self._last = (self.boot_id, affinity, load)
        return self._last
