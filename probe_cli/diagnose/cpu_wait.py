"""Whether waiting for a CPU explains a late rank, and whose the wait is. Pure functions over
each rank's ``cpu_window`` row (the steps of the window whose arrivals are judged; from an
older agent, the wait share of ``straggler_steps`` / ``doctor_loop`` alone); the straggler
verdict (straggler.py) decides with them whether to name the rank.

A rank descheduled for W of its step time arrives late by up to W, so an excess lateness above
its own wait is more than the host explains ("beyond": a sleep, a slow input, a slower device).
Within it there are four cases, by what the rank's training thread did on the CPU:

- "compute": it ran on a CPU clearly more than the others (``RUN_MARGIN``): it has more work,
  and waits more for it (``computes_more``). A straggler.
- "shared": it waited more, but it shares the machine and its CPUs with every rank it is
  compared to (same boot id, overlapping affinity: no pinning). The scheduler decides which
  of the threads on shared cores waits, so the rank is not the cause: the machine is
  oversubscribed. Measured: num_clip_small (a healthy job) at load ~7 on 2 cores had rank 0
  named because it "waited for a CPU 43% of its step time".
- "own": it waited more, on CPUs of its own (disjoint affinity, or another machine):
  another process or too many threads on *its* cores. A straggler, with that cause.
- "scheduler": every rank waits alike, and which one is late follows the scheduler.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, NamedTuple

from probe_protocol.cpulist import cpu_list, parse_cpu_list

from ..group import rank_label

#: A rank's CPU wait explains its lateness when it is at least this fraction of the excess.
OWN_CPU_SHARE = 0.5
#: A rank computes more when its time on a CPU exceeds the others' median by this fraction of
#: it (healthy ranks on shared cores measured within 12% of each other; 3x the matmuls, 1.7-2x)
RUN_MARGIN = 0.25
#: ... and by at least this share of the step (tiny shares are noise).
RUN_FLOOR = 0.02


@dataclass(frozen=True, slots=True)
class RankCpu:
    """One rank's CPU time over the window, as shares of its step time, and where it ran."""

    wait: float
    """Runnable but waiting for a CPU (Linux run queue)."""
    run: float | None = None
    """On a CPU."""
    machine: str | None = None
    """The kernel's boot id (the host name where there is none)."""
    cpus: frozenset[int] | None = None
    """The CPUs its training thread may run on."""
    load: float | None = None
    """The machine's 1-minute load average."""

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RankCpu | None:
        """From a ``cpu_window`` (or ``straggler_steps`` / ``doctor_loop``: the wait share
        alone) row; None without ``cpu_wait_share``."""
        wait = row.get("cpu_wait_share")
        if not isinstance(wait, (int, float)):
            return None
        run, load = row.get("cpu_run_share"), row.get("load_1m")
        machine = row.get("boot_id")
        return cls(float(wait), float(run) if isinstance(run, (int, float)) else None,
                   machine if isinstance(machine, str) and machine else None,
                   parse_cpu_list(row.get("cpu_affinity")),
                   float(load) if isinstance(load, (int, float)) else None)


class Contention(NamedTuple):
    kind: str
    """beyond, compute, shared, own or scheduler (module docstring)."""
    line: str
    """What the waits show, for the verdict's details."""
    cpus: str = ""
    """shared: the CPUs the ranks share (``0-1``)."""


def shared_cores(rank: int, cpu: dict[int, RankCpu]) -> frozenset[int] | None:
    """The CPUs ``rank`` shares with the other ranks, when it shares its machine and some of
    its CPUs with every one of them; None when one of them runs elsewhere (or it is unknown)."""
    mine = cpu.get(rank)
    if mine is None or mine.machine is None or not mine.cpus:
        return None
    common: set[int] = set()
    for r, c in cpu.items():
        if r == rank:
            continue
        if c.machine != mine.machine or not c.cpus or not c.cpus & mine.cpus:
            return None
        common |= c.cpus & mine.cpus
    return frozenset(common) if common else None


def computes_more(mine: RankCpu, others: list[RankCpu]) -> bool:
    """Whether ``mine`` ran on a CPU clearly more than the others' median (by ``RUN_MARGIN`` of
    it and ``RUN_FLOOR`` of the step): more work of its own. Its wait is no alibi then: on
    shared cores the scheduler makes a thread that computes more wait more, and more than in
    proportion (a rank that sleeps in its collectives gets the CPU first when it wakes):
    measured, 3x the matmuls ran 0.21 of the step against 0.11 and waited 0.45 against 0.08."""
    runs = [o.run for o in others if o.run is not None]
    if mine.run is None or len(runs) < len(others):
        return False
    base = statistics.median(runs)
    return mine.run - base >= max(RUN_MARGIN * base, RUN_FLOOR)


def cpu_contention(rank: int, excess: float, cpu: dict[int, RankCpu]) -> Contention | None:
    """Whether waiting for a CPU explains why ``rank`` costs the others ``excess`` of the
    window, and whose the wait is; None when not recorded on this rank and another."""
    mine = cpu.get(rank)
    others = [c for r, c in cpu.items() if r != rank]
    if mine is None or not others:
        return None
    base = statistics.median(o.wait for o in others)
    line = (f"waiting for a CPU (run queue): rank {rank} {mine.wait:.0%} of its step time, the "
            f"others a median {base:.0%}")
    if mine.run is not None and all(o.run is not None for o in others):
        line += (f"; on a CPU: rank {rank} {mine.run:.0%}, the others a median "
                 f"{statistics.median(o.run for o in others if o.run is not None):.0%}")
    if excess > mine.wait:
        return Contention("beyond", line + f"; its excess {excess:.1%} is more than that explains")
    if computes_more(mine, others):
        return Contention("compute", line + "; it computes more than the others (and so waits "
                          "more): the extra work is its own")
    if mine.wait - base >= max(OWN_CPU_SHARE * excess, mine.wait / 2):  # most of it its own
        shared = shared_cores(rank, cpu)
        if shared is not None:
            cpus = cpu_list(shared)
            return Contention("shared", line + f"; {rank_label(cpu)} share CPUs {cpus} of "
                              f"one machine{load_note(mine)}, so which of them waits is the "
                              "scheduler's pick", cpus)
        return Contention("own", line + "; its own cores are busy")
    return Contention("scheduler", line + "; every rank waits alike, so which one is late is "
                      "the scheduler's pick")


def load_note(mine: RankCpu) -> str:
    """`` at load 7.2`` (the machine's 1-minute load average), or "" when not recorded."""
    return "" if mine.load is None else f" at load {mine.load:.1f}"
