"""The LR schedule beside GB_tok: warmup and decay in tokens, where the schedule ends and the
tokens seen by then, and the guide's trap (a schedule whose end is not the job's). Pure: the
``schedule`` canned query's rows of one rank, the job's GB_tok and its current step in,
JSON-ready dicts out (`probe throughput` shows them).

Steps are scheduler steps. They are optimizer steps only when the scheduler steps once per
optimizer step: its own count, read at optimizer step N, is then about N - 1 (it steps after
``optimizer.step()``). When it is not (a per-epoch scheduler), no tokens are given and the
block says why.
"""

from __future__ import annotations

from typing import Any

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
