"""The LR schedule beside GB_tok: warmup and decay in tokens, where the schedule ends and the
tokens seen by then, and the guide's trap (a schedule whose end is not the job's). Pure: the
``schedule`` canned query's rows of one rank, the job's GB_tok and its current step in,
JSON-ready dicts out (`probe throughput` shows them); doctor's LR SCHEDULE finding from the same
blocks.

Steps are scheduler steps. They are optimizer steps only when the scheduler steps once per
optimizer step: its own count, read at optimizer step N, is then about N - 1 (it steps after
``optimizer.step()``). When it is not (a per-epoch scheduler), no tokens are given and the
block says why.
"""

from __future__ import annotations

from typing import Any

from .checks import DoctorCheck, Evidence
from .findings import INFO, Finding, RankDoc, Report
from .isolated import docs_not_data_parallel
from .throughput import from_rows

#: How far the scheduler's own count may be from the optimizer's and still be "per step".
STEP_SLACK = 2
AFTER = {"constant": "at the schedule's final LR", "rises": "with the LR climbing again",
         "raises": "until the scheduler raises (OneCycleLR: ValueError past total_steps)"}


def _int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def schedules(rows: list[dict[str, Any]], gb_tok: Any, step: Any) -> list[dict[str, Any]]:
    """One block per scheduler (an empty list when the rank has not read its schedule yet)."""
    return [_block(r, _int(gb_tok), _int(step)) for r in rows]


def _tok(steps: int | None, gb: int | None) -> int | None:
    return steps * gb if steps is not None and gb else None


def _block(r: dict[str, Any], gb: int | None, now: int | None) -> dict[str, Any]:
    w, e, t = _int(r.get("warmup_steps")), _int(r.get("end_step")), _int(r.get("total_steps"))
    read_at, own = _int(r.get("step")), _int(r.get("sched_steps"))
    b: dict[str, Any] = {k: r.get(k) for k in (
        "scheduler", "location", "kind", "method", "warmup_steps", "end_step", "after_end",
        "sched_steps", "total_steps", "total_source", "framework", "note")}
    b["read_at_step"] = read_at
    b["observed"] = _observed(r, gb)
    per_step = None if own is None or read_at is None else abs(own - (read_at - 1)) <= STEP_SLACK
    b["per_optimizer_step"] = per_step
    if per_step is False:
        b["warmup_tokens"] = b["decay_tokens"] = b["end_tokens"] = b["total_tokens"] = None
        b["check"] = (f"the scheduler had stepped {own} times in {read_at} optimizer steps: "
                      "its steps are not optimizer steps (per epoch?), so no tokens are given")
        return b
    b["warmup_tokens"] = _tok(w, gb)
    b["decay_tokens"] = _tok(e - (w or 0), gb) if e is not None else None
    b["end_tokens"] = _tok(e, gb)
    b["total_tokens"] = _tok(t, gb)
    b["check"] = _check(e, t, now, r.get("total_source"), r.get("after_end"), gb)
    return b


def _observed(r: dict[str, Any], gb: int | None) -> dict[str, Any] | None:
    """The LR as recorded at each step: first, peak and last, with their steps, and the
    warmup seen (the steps to the peak, in tokens) when the peak came after the first step.
    What a loop that sets the LR itself has instead of a scheduler to read."""
    first, peak, last = (_int(r.get(k)) for k in ("lr_first_step", "lr_peak_step",
                                                   "lr_last_step"))
    if first is None or r.get("lr_peak") is None:
        return None
    o = {k: r.get(k) for k in ("lr_first", "lr_first_step", "lr_peak", "lr_peak_step",
                               "lr_last", "lr_last_step")}
    o["warmup_steps"] = peak if peak is not None and first is not None and peak > first \
        and first <= 1 else None
    o["warmup_tokens"] = _tok(o["warmup_steps"], gb)
    o["since_peak"] = None if peak is None or last is None else last - peak
    return o


def _check(end: int | None, total: int | None, now: int | None, source: Any, after: Any,
           gb: int | None) -> str | None:
    """The trap, when it shows: a declared total that is not the schedule's end, else a job
    already past the end."""
    if end is None:
        return None
    past = AFTER.get(str(after), "past the schedule")
    if total is not None and total != end:
        if end < total:
            n = total - end
            return (f"the schedule ends at step {end} but the job runs to step {total} "
                    f"({source}): its last {n} steps{_in_tokens(n, gb)} run {past}")
        return (f"the job stops at step {total} ({source}) but the schedule ends at step {end}: "
                f"it stops {total / end:.0%} of the way and the LR never reaches the end")
    if total is None and now is not None and now > end:
        n = now - end
        return (f"step {now} is past the schedule's end at step {end}: {n} steps"
                f"{_in_tokens(n, gb)} so far ran {past} (was total_steps computed from the "
                "micro-batch?)")
    return None


def _in_tokens(n: int, gb: int | None) -> str:
    return f" ({n * gb:,} tokens)" if gb else ""


def job_schedules(docs: list[RankDoc]) -> list[dict[str, Any]]:
    """The blocks from doctor's answers: the lowest rank's schedule rows, GB_tok and the latest
    step as `probe throughput` computes them."""
    rows = next((d.schedule for d in sorted(docs, key=lambda d: d.rank) if d.schedule), None)
    if not rows:
        return []
    layout = next((d.parallel[0] for d in sorted(docs, key=lambda d: d.rank) if d.parallel),
                  None)
    tput = {d.rank: d.throughput[0] for d in docs if d.throughput}
    job = from_rows(tput, len(docs), layout=layout, isolated=docs_not_data_parallel(docs)
                    )[1].to_json() if tput else {}
    now = max((int(r["last_step"]) for r in tput.values() if r.get("last_step") is not None),
              default=None)
    return schedules(rows, job.get("gb_tok"), now)


def check_schedule(report: Report, docs: list[RankDoc]) -> None:
    """LR SCHEDULE (info): the schedule's end is not the job's (see ``_check``). Info, not a
    warning: a cosine restarted on purpose past its end is a choice probe cannot tell from
    the trap, so it says what it sees and leaves the judgement to the reader."""
    blocks = job_schedules(docs)
    if not blocks:
        report.unchecked.append("LR schedule: not read yet (or not recorded by this agent)")
        return
    hits = [b for b in blocks if b.get("check")]
    if not hits:
        known = [b for b in blocks if b.get("scheduler")]
        report.fine.append("LR schedule: " + ("; ".join(
            f"{b['scheduler']} {b.get('kind')}" + (f", ends at step {b['end_step']}"
                                                   if b.get("end_step") is not None else "")
            for b in known) if known else "no LR scheduler"))
        return
    b = hits[0]
    evidence = [f"{b['scheduler']} ({b.get('location')}), {b.get('method')}: warmup "
                f"{b.get('warmup_steps') or 0} steps, "
                + (f"decay ends at step {b['end_step']}" if b.get("end_step") is not None
                   else "no decay end known")
                + (f" = {b['end_tokens']:,} tokens" if b.get("end_tokens") else "")
                + (f"; job total {b['total_steps']} ({b.get('total_source')})"
                   if b.get("total_steps") is not None else "")]
    report.findings.append(Finding(
        INFO, "schedule", f"LR SCHEDULE: {b['check']}", evidence,
        "probe throughput   (the schedule beside GB_tok, in steps and tokens)",
        sorted(d.rank for d in docs), score=0.0, detail={"schedule": b}))


#: The check of this module, for doctor.py's registry (checks.py).
CHECKS = (
    DoctorCheck("schedule", 100, lambda report, ctx: check_schedule(report, ctx.docs),
                evidence=(Evidence("throughput", "throughput", lambda last: {"last": last}),
                          Evidence("schedule", "schedule"), Evidence("parallel", "parallel"))),
)
