"""`probe doctor`'s report as text and JSON (pure; stdlib only): findings ranked by severity,
each with its evidence and the next command, then what was fine and what was not checked."""

from __future__ import annotations

import json
from typing import Any

from ..diagnose.findings import INFO, Report
from ..group import rank_label


def doctor_header(ranks: list[int | None], steps: list[int]) -> str:
    """``probe doctor: ranks 0,1 answered, step 40`` (or ``steps 38-40``)."""
    at = f", step {steps[-1]}" if len(steps) == 1 else (
        f", steps {steps[0]}-{steps[-1]}" if steps else "")
    return f"probe doctor: {rank_label(ranks)} answered{at}"


def render(report: Report, header: str) -> list[str]:
    ranked = report.ranked()
    n = sum(f.severity != INFO for f in ranked)
    lines = [f"{header}; {n} problem{'s' if n != 1 else ''} found" if n else
             f"{header}; no problem found", ""]
    for i, f in enumerate(ranked, 1):
        lines.append(f"{i}. [{f.severity}] {f.title}")
        lines.extend(f"     {e}" for e in f.evidence)
        if f.next:
            lines.append(f"     next: {f.next}")
    if report.fine:
        lines += ["", "fine:", *(f"  {x}" for x in report.fine)]
    if report.unchecked:
        lines += ["", "not checked:", *(f"  {x}" for x in report.unchecked)]
    return lines


def render_json(report: Report, ranks: list[dict[str, Any]]) -> str:
    return json.dumps({**report.to_dict(), "ranks": ranks}, indent=2)
