"""`probe doctor`'s verdict: every check, in the order that keeps one problem from hiding behind
another, over what every rank answered. Pure; ``commands/doctor.py`` gathers the answers and
render/doctor.py writes the report.
"""

from __future__ import annotations

from typing import Any

from .findings import RankDoc, Report
from .hang import HangVerdict, RankState
from .memory_use import check_memory_use
from .number_checks import check_lr_clip, check_memory, check_nonfinite
from .schedule import check_schedule
from .throughput import check_throughput
from .time_checks import (
    busy_not_stuck,
    check_collective_wait,
    check_data_wait,
    check_hang,
    check_modules,
    check_stalls,
    check_straggler,
)


def rank_doc(state: RankState, answer: dict[str, Any] | None) -> RankDoc:
    """One rank's evidence: its hang-round state (main-thread frames, collectives) and its
    second-round ``answer`` (``commands/doctor.py``: the doctor state, the gradient check and
    the canned queries' records, keyed as ``RankDoc``'s fields; None when it gave none)."""
    data = answer or {}
    return RankDoc(
        rank=state.rank, state=data.get("state"), grads=data.get("grads"),
        loop=data.get("loop"), memory=data.get("memory"), metrics=data.get("metrics"),
        breakdown=data.get("breakdown"), activations=data.get("activations"),
        slow=data.get("slow"), throughput=data.get("throughput"),
        schedule=data.get("schedule"), parallel=data.get("parallel"), frames=state.frames,
        collectives=tuple(data["collectives"]) if data.get("collectives") else state.collectives,
        errors=data.get("errors") or {})


def diagnose(verdict: HangVerdict, docs: list[RankDoc], min_wait: float) -> Report:
    report = Report()
    verdict = busy_not_stuck(verdict, docs, min_wait)
    check_hang(report, verdict)
    if not verdict.problem:
        check_stalls(report, docs, min_wait)
    check_nonfinite(report, docs)
    check_memory(report, docs)
    check_memory_use(report, docs)
    if verdict.problem:  # timings from before a hang describe the past, and would distract
        report.unchecked.append("straggler, collective wait: the job is hung (see above)")
    else:
        check_straggler(report, docs)
        check_collective_wait(report, docs)
    if any(f.check == "stall" for f in report.findings):
        report.unchecked.append("DataLoader wait share: a rank is stalled (see above)")
    else:
        check_data_wait(report, docs)
    check_lr_clip(report, docs)
    check_schedule(report, docs)
    if not verdict.problem:
        check_throughput(report, docs)
    check_modules(report, docs)
    return report


def steps_seen(docs: list[RankDoc]) -> list[int]:
    """The optimizer steps the ranks were at, sorted and distinct (for the report's header)."""
    return sorted({(d.state or {}).get("clock", {}).get("step") for d in docs} - {None})
