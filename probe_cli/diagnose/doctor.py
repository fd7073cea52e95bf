"""`probe doctor`'s verdict: every check, in the order that keeps one problem from hiding behind
another, over what every rank answered. Pure; ``commands/doctor.py`` gathers the answers and
render/doctor.py writes the report. Each check declares itself (checks.py) in the module that
implements it; ``DEFAULT_CHECKS`` lists those modules.
"""

from __future__ import annotations

from typing import Any

from . import (
    clipping,
    guard_check,
    isolated,
    lever_checks,
    lr_checks,
    memory_growth,
    memory_use,
    nonfinite,
    numerics,
    schedule,
    throughput,
    time_checks,
    unused_params,
)
from .checks import Context, DoctorCheck, Evidence
from .findings import RankDoc, Report
from .hang import HangVerdict, RankState

#: The modules whose ``CHECKS`` doctor runs (checks.py). A new check is a module of its own
#: and one line here.
DEFAULT_CHECKS = (time_checks, nonfinite, memory_growth, lr_checks, numerics, guard_check,
                  clipping, memory_use, schedule, throughput, lever_checks, isolated, unused_params)


def doctor_checks() -> list[DoctorCheck]:
    """Every check, in the order it runs."""
    return sorted((c for m in DEFAULT_CHECKS for c in m.CHECKS), key=lambda c: c.order)


def evidence() -> list[Evidence]:
    """The canned queries the checks read, each key once, in the order the checks run."""
    seen: dict[str, Evidence] = {}
    for check in doctor_checks():
        for e in check.evidence:
            seen.setdefault(e.key, e)
    return list(seen.values())


def rank_doc(state: RankState, answer: dict[str, Any] | None) -> RankDoc:
    """One rank's evidence: its hang-round state (main-thread frames, collectives) and its
    second-round ``answer`` (``gather/evidence.py``: the doctor state, the gradient check and
    the checks' evidence, keyed as ``Evidence.key``; None when it gave none)."""
    data = answer or {}
    doc = RankDoc(
        rank=state.rank, state=data.get("state"), grads=data.get("grads"), frames=state.frames,
        children=state.children,
        collectives=tuple(data["collectives"]) if data.get("collectives") else state.collectives,
        errors=data.get("errors") or {})
    for e in evidence():
        doc.file(e.key, data.get(e.key))
    doc.file("cpu", data.get("cpu"))  # the cpu_window row, over the collectives' window
    return doc


def diagnose(verdict: HangVerdict, docs: list[RankDoc], min_wait: float) -> Report:
    """Every check over every rank's evidence, in order (``doctor_checks``)."""
    report = Report()
    # a held-GIL verdict whose suspects kept stepping is a busy node, not a hang
    ctx = Context(time_checks.busy_not_stuck(verdict, docs, min_wait), docs, min_wait)
    for check in doctor_checks():
        check.run(report, ctx)
    return report


def steps_seen(docs: list[RankDoc]) -> list[int]:
    """The optimizer steps the ranks were at, sorted and distinct (for the report's header)."""
    return sorted({(d.state or {}).get("clock", {}).get("step") for d in docs} - {None})
