"""What a job cost training: the median step time while it ran over the median before it.

One measure for every job that runs beside training (a profile window, a flame session, an
eval still running): medians, because on a shared machine a few steps that ran during a read
can be many times slower than the rest (DESIGN). The step times come from ``python.steps``
through the shipped queries ``step_times_window`` and ``step_times_before``.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from typing import Any

from .store.catalog import shipped_sql

log = logging.getLogger(__name__)

#: Steps before a job whose median is its baseline.
BASELINE_STEPS = 20
#: A step number past any real one: "every step before the time".
ANY_STEP = 2**62


def compare(window_s: list[float], before_s: list[float]) -> dict[str, Any]:
    """Medians (ms) of the steps in a window and before it, and their ratio when both exist."""
    cost: dict[str, Any] = {"window_steps": len(window_s), "before_steps": len(before_s)}
    if window_s:
        cost["window_ms"] = round(statistics.median(window_s) * 1e3, 3)
    if before_s:
        cost["before_ms"] = round(statistics.median(before_s) * 1e3, 3)
    if window_s and before_s and cost["before_ms"] > 0:
        cost["ratio"] = round(cost["window_ms"] / cost["before_ms"], 3)
    return cost


def steps_before(query: Callable[..., Any], until: float, step: int = ANY_STEP) -> list[float]:
    """Durations (s) of the last BASELINE_STEPS steps up to ``step`` that ended by ``until``."""
    try:
        res = query(shipped_sql("step_times_before"),
                    params={"step": step, "until": until, "last": BASELINE_STEPS})
        return [float(r[0]) for r in res.rows]
    except Exception as e:  # the measure is a courtesy; a store problem must not fail the job
        log.info("probe agent: no baseline step times: %s", e)
        return []


def measure(query: Callable[..., Any], since: float, until: float) -> dict[str, Any]:
    """The cost of a job that ran from ``since`` to ``until`` (epoch seconds).

    Args:
        query: the store's ``query(sql, params=...)``.
    """
    try:
        inside = [float(r[0]) for r in query(shipped_sql("step_times_window"),
                                             params={"since": since, "until": until}).rows]
    except Exception as e:  # as above
        log.info("probe agent: no step times for a job's cost: %s", e)
        inside = []
    return compare(inside, steps_before(query, since))


def describe_cost(cost: dict[str, Any]) -> str:
    """``step time x1.84 (46.1 ms vs 25.0 ms before, 3 vs 20 steps)``, or what is missing."""
    if "ratio" in cost:
        return (f"step time x{cost['ratio']:.2f} ({cost['window_ms']:.1f} ms vs "
                f"{cost['before_ms']:.1f} ms before, {cost['window_steps']} vs "
                f"{cost['before_steps']} steps)")
    if "window_ms" in cost:
        return f"step time {cost['window_ms']:.1f} ms (no earlier steps to compare with)"
    return "no step finished in the window"
