"""How long a collective must wait before it counts as stuck, from the job's own rhythm (the
hang verdict's threshold; pure). A job with 8 s steps legitimately waits seconds in every
all-reduce; a job with 50 ms steps that waits 3 s is stuck. So the threshold is a multiple of the
gaps between the job's own collective starts, not a fixed number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .hang import RankState

#: Without enough history the threshold is this fixed wait (the old default).
FALLBACK_WAIT_S = 5.0
#: Stuck means waiting this many times the job's own normal gap between collectives ...
NORMAL_FACTOR = 4.0
#: ... and never less than this (thread wake-ups, a busy node's scheduling).
FLOOR_WAIT_S = 3.0
#: Gaps needed before the job's own rhythm is trusted over FALLBACK_WAIT_S.
MIN_GAPS = 5


@dataclass(frozen=True, slots=True)
class WaitRule:
    """How long a collective must have waited to count as stuck, and what that rests on."""

    wait_s: float
    basis: str
    gaps: int = 0


def normal_wait(states: list[RankState], fixed: float | None = None) -> WaitRule:
    """The job's own measure of "too long": ``NORMAL_FACTOR`` x the 90th percentile of the gaps
    between consecutive collective starts on each rank (a step with one all-reduce waits at most
    about one gap; a job with 8 s steps is not hung after 5 s). ``fixed`` (``--min-wait``)
    overrides it. Robust: a percentile, not the max, so one slow checkpoint step does not raise
    the bar for good."""
    if fixed is not None:
        return WaitRule(fixed, f"a fixed threshold of {fixed:g} s (--min-wait)")
    gaps: list[float] = []
    for s in states:
        starts = sorted(float(r["start_time"]) for r in s.collectives
                        if r.get("start_time") is not None and r.get("state") != "pending")
        gaps += [b - a for a, b in zip(starts, starts[1:]) if b > a]
    if len(gaps) < MIN_GAPS:
        return WaitRule(FALLBACK_WAIT_S, f"a fixed {FALLBACK_WAIT_S:g} s: too few collectives "
                        f"seen ({len(gaps)} gaps) to learn this job's rhythm", len(gaps))
    gaps.sort()
    p90 = gaps[min(len(gaps) - 1, int(0.9 * len(gaps)))]
    wait = max(FLOOR_WAIT_S, NORMAL_FACTOR * p90)
    return WaitRule(wait, f"this job starts a collective every {_secs(p90)} or less (90th "
                    f"percentile of {len(gaps)} gaps); stuck means {wait:.1f} s "
                    f"({NORMAL_FACTOR:g}x, at least {FLOOR_WAIT_S:g} s)", len(gaps))


def _secs(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"
