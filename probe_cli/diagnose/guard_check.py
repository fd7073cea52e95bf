"""`probe doctor`'s view of the step guard (`probe guard`): each firing is a step the ranks
skipped (GUARD FIRED), read off every rank's ``/v1/numerics`` state. Pure; shared with
`probe numerics`.
"""

from __future__ import annotations

from ..group import rank_label
from .checks import DoctorCheck
from .findings import WARNING, Finding, RankDoc, Report


def check_guard(report: Report, docs: list[RankDoc]) -> None:
    """The step guard's firings (`probe guard`): each is a step the ranks skipped."""
    fired: dict[str, list[int]] = {}
    armed = []
    for d in docs:
        g = ((d.state or {}).get("numerics") or {}).get("guard")
        if not g:
            continue
        armed.append(d.rank)
        for f in g.get("firings") or []:
            line = f"step {f.get('step')}: {f.get('why')} -> {', '.join(f.get('done') or [])}"
            fired.setdefault(line, []).append(d.rank)
    if fired:
        lines = [f"{rank_label(r)}: {x}" for x, r in fired.items()]
        n = len(fired)
        report.findings.append(Finding(
            WARNING, "guard", f"GUARD FIRED {n} time{'s' if n != 1 else ''}: " + lines[-1],
            lines, "probe query \"SELECT timestamp, rank, at_step, code FROM python.audit "
            "WHERE kind = 'guard' ORDER BY timestamp\"", sorted(armed), score=0.65))
    elif armed:
        report.fine.append(f"guard: armed on {rank_label(armed)}, has not fired")


#: The check of this module, for doctor.py's registry (checks.py): right after the loss
#: verdicts (numerics.py, 35).
CHECKS = (
    DoctorCheck("guard", 36, lambda report, ctx: check_guard(report, ctx.docs)),
)
