"""`probe doctor`'s NaN/Inf check: logged metrics, clip_grad_norm_'s non-finite norms, the
gradients' finite check and the per-step loss and norm (``python.numerics``), with where the
first NaN/Inf was born when the agent's re-run found it (origin_lines). Pure; shared
with `probe numerics`.
"""

from __future__ import annotations

import math
from typing import Any

from ..group import rank_label
from .checks import DoctorCheck, Evidence
from .findings import CRITICAL, Finding, RankDoc, Report, first_loop, num
from .numerics import TREND_WINDOW, fmt4


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


def origin_lines(docs: list[RankDoc]) -> tuple[list[str], list[int], str | None, str]:
    """The NaN origin from every rank's ``first_nonfinite``: evidence lines, the ranks where
    it was born, a title tail and the next step."""
    firsts = [(d.rank, (d.state or {}).get("numerics", {}).get("first_nonfinite"))
              for d in docs]
    firsts = [(r, f) for r, f in firsts if f]
    if not firsts:
        return [], [], None, ""
    step = min(int(num(f.get("step")) or 0) for _, f in firsts)
    born = [(r, f) for r, f in firsts
            if f.get("stage") in ("weights", "input", "forward", "backward")]
    lines = []
    for r, f in firsts:
        lines.append(f"rank {r}: first non-finite at step {f.get('step')} (loss "
                     f"{fmt4(num(f.get('loss')))}, gradient norm {f.get('grad_norm')}): "
                     + _where(f))
    if not born:
        rerun = ("not re-run to find the origin" if all(f.get("stage") == "unchecked"
                                                        for _, f in firsts)
                 else "the re-run found no origin")
        return lines, [], f"first at step {step}; {rerun}", \
            "probe query \"SELECT * FROM python.numerics WHERE kind = 'origin'\""
    r, f = born[0]
    tail = f"first at step {f.get('step')} on rank {r}: " + _where(f)
    nxt = {"weights": f"the weights were bad before step {f.get('step')} began: restore the "
                      "last good checkpoint, then find what wrote them (the optimizer step "
                      "before it, a loaded checkpoint, code that sets them); probe guard "
                      "--skip-nonfinite keeps bad steps out meanwhile",
           "input": f"look at sample(s) {_samples(f)} of the dataset: it holds NaN/Inf",
           "forward": f"guard the op in module {f.get('module')!r} (clamp its input, add an "
                      "epsilon); probe guard --skip-nonfinite keeps the weights meanwhile",
           "backward": f"the backward of {f.get('op')} in module {f.get('module')!r} divides "
                       "by zero or overflows at that input: add an epsilon inside it"}
    return lines, [x for x, _ in born], tail, nxt.get(str(f.get("stage")), "")


def _samples(f: dict[str, Any]) -> str:
    s = f.get("samples") or []
    return ", ".join(str(x) for x in s[:8]) or "?"


def _where(f: dict[str, Any]) -> str:
    stage, mod, op = f.get("stage"), f.get("module"), f.get("op")
    which = f"sample(s) {_samples(f)} ({f.get('samples_are', 'rows of the batch')}" + (
        f", micro-batch {f.get('micro_batch')})" if f.get("micro_batch") is not None else ")")
    if stage == "input":
        return f"received from the input batch: {which}"
    cls = f" ({f['module_class']})" if f.get("module_class") else ""
    if stage == "weights":
        rows = f.get("param_rows") or []
        return (f"in the weights: parameter {f.get('param')!r} of module {mod!r}{cls} held "
                f"NaN/Inf before the step's forward ({f.get('bad_values')} of "
                f"{f.get('values')} values" + (f"; rows {rows}" if rows else "") + ")")
    if stage == "forward":
        return f"produced in the forward of module {mod!r}{cls} by {op or 'an op'}: {which}"
    if stage == "backward":
        return f"produced in the backward of module {mod!r}{cls} by {op or 'an op'}"
    if stage == "unchecked":  # no re-run happened: nothing says where it came from
        return f"not re-run ({f.get('note') or 'no reason recorded'})"
    return f"received (this rank's re-run stayed finite: {f.get('note') or 'not born here'})"


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
