"""`probe doctor`'s NaN/Inf check: logged metrics, clip_grad_norm_'s non-finite norms, the
gradients' finite check and the per-step loss and norm (``python.numerics``), with where the
first NaN/Inf was born when the agent's re-run found it (numerics.origin_lines). Pure; shared
with `probe numerics`.
"""

from __future__ import annotations

import math
from typing import Any

from ..group import rank_label
from .checks import DoctorCheck, Evidence
from .findings import CRITICAL, Finding, RankDoc, Report, first_loop, num
from .numerics import TREND_WINDOW, origin_lines


def check_nonfinite(report: Report, docs: list[RankDoc]) -> None:
    evidence: list[str] = []
    ranks: set[int] = set()
    first: list[int] = []
    #: first bad steps that are the first step a window read (doctor --last): not a start
    unread: set[int] = set()
    for d in docs:
        for m in d.metrics or []:
            last_ok = num(m.get("last_finite"))
            before = f" (last finite value {last_ok:.4g})" if last_ok is not None else ""
            evidence.append(f"rank {d.rank}: logged {m.get('name')} is NaN/Inf at "
                            f"{m.get('nonfinite')} of {m.get('logged')} steps, first at step "
                            f"{m.get('first_step')}{before}")
            ranks.add(d.rank)
            first.append(int(num(m.get("first_step")) or 0))
        loop = first_loop(d)
        n_bad = int(num(loop.get("nonfinite_grad_steps")) or 0)
        if n_bad:
            evidence.append(f"rank {d.rank}: clip_grad_norm_ saw a NaN/Inf gradient norm on "
                            f"{loop['nonfinite_grad_steps']} of the last {loop.get('steps')} "
                            f"steps (steps {loop.get('first_nonfinite_step')}-"
                            f"{loop.get('last_nonfinite_step')})")
            ranks.add(d.rank)
            first.append(int(num(loop.get("first_nonfinite_step")) or 0))
            if n_bad >= int(num(loop.get("steps")) or 0):  # every step read: began earlier
                unread.add(first[-1])
        g = d.grads or {}
        if g.get("checked") and g.get("nonfinite"):
            evidence.append(f"rank {d.rank}: {g['nonfinite']} of {g.get('params')} parameters "
                            f"have NaN/Inf gradients at step {g.get('step')}")
            ranks.add(d.rank)
        read = d.rows("numerics") or []
        bad = [r for r in read if r.get("nonfinite") or
               (num(r.get("loss")) is not None and not math.isfinite(num(r.get("loss")) or 0))]
        if bad:
            if bad[0] is read[0]:  # the first row read is bad: it may have begun before it
                unread.add(int(bad[0]["step"]))
            evidence.append(f"rank {d.rank}: loss or gradient norm NaN/Inf at {len(bad)} "
                            f"recorded steps, first at step {bad[0]['step']} (loss "
                            f"{_loss_text(bad[0].get('loss'))}, gradient norm "
                            f"{bad[0].get('grad_norm')})")
            ranks.add(d.rank)
            first.append(int(bad[0]["step"]))
    lines, born, tail, nxt = origin_lines(docs)
    if lines:
        ranks.update(int(x) for x in (born or []))
    if evidence or lines:
        since = f" since step {min(first)}" if first else ""
        if first and min(first) in unread and min(first) > 1:  # "since step 199": the
            # first step the window read, not when it began
            since = f" since step {min(first)} or earlier (the first step read)"
        title = (f"NaN/Inf: {tail}" if tail else f"NaN/Inf: {rank_label(sorted(ranks))} "
                 f"{_verb(ranks, 'trains', 'train')} on NaN/Inf values{since}")
        received = sorted(ranks - set(born)) if born else []
        if born and received:
            lines.append(f"{rank_label(received)} received it (the gradient all-reduce "
                         "spreads a NaN to every rank in the same step)")
        report.findings.append(Finding(
            CRITICAL, "nonfinite", title, lines + evidence, nxt or
            'probe query "SELECT step, module, stage, role, op, samples, note FROM '
            "python.numerics WHERE kind IN ('origin', 'anomaly') ORDER BY step LIMIT 20\"",
            sorted(born) if born else sorted(ranks), score=1e6,
            detail={"born": sorted(born), "first_step": min(first) if first else None}))
        return
    checked = [d for d in docs if (d.grads or {}).get("checked")]
    sources = []
    if checked:
        sources.append(f"gradients finite at step {checked[0].grads['step']}")  # type: ignore
    if any(d.metrics is not None for d in docs):
        sources.append("no NaN/Inf in logged metrics")
    if sources:
        report.fine.append("NaN/Inf: " + "; ".join(sources))
    else:
        why = next(((d.grads or {}).get("reason") for d in docs if d.grads), None)
        report.unchecked.append(f"NaN/Inf: {why or 'no gradients or metrics to check'}")


def _verb(ranks: Any, one: str, many: str) -> str:
    return one if len(set(ranks)) == 1 else many



#: The check of this module, for doctor.py's registry (checks.py): first of the numbers (30).
CHECKS = (
    DoctorCheck("nonfinite", 30, lambda report, ctx: check_nonfinite(report, ctx.docs),
                evidence=(Evidence("loop", "doctor_loop", lambda last: {"last": last}),
                          Evidence("metrics", "doctor_metrics"),
                          Evidence("numerics", "numerics", lambda last: {
                              "window": max(last, TREND_WINDOW)}))),
)


def _loss_text(v: object) -> str:
    """A loss as the other lines print it (4 significant digits; NaN as the agent sent it)."""
    x = num(v)
    return f"{x:.4g}" if x is not None and math.isfinite(x) else str(v)
