"""`probe throughput` as text lines (pure; diagnose/throughput.py computes)."""

from __future__ import annotations

from typing import Any

from ..diagnose.throughput import SHARES, RankThroughput


def _n(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def si(v: Any, unit: str = "") -> str:
    x = _n(v)
    if x is None:
        return "?"
    for scale, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {p}{unit}"
    return f"{x:.3g} {unit}".rstrip()


def pct(v: Any) -> str:
    x = _n(v)
    return "?" if x is None else f"{100 * x:.1f}%"


#: Why there is no token figure: the two ways tokens are known (collectors/throughput.py).
NO_TOKENS = ("no token count: the model's inputs seen on traced steps are not integer token ids, "
             "and the loop logs none (`probe_agent.log(tokens=N)` each step gives them)")


def _or(v: Any, unknown: str = "?") -> str:
    """A value as text; None (not recorded) as ``unknown``, never as "None"."""
    return unknown if v is None else str(v)


def _gb_tok(job: dict[str, Any]) -> str:
    if job.get("gb_tok") is None and job.get("context_len") is None:
        return f"  GB_tok: {NO_TOKENS}"
    return (f"  GB_tok {si(job.get('gb_tok'), 'tokens')} = micro-batch "
            f"{_or(job.get('micro_batch'))} x accumulation {_or(job.get('accumulation'))} x "
            f"data-parallel ranks {_or(job.get('dp_world'))} x context "
            f"{_or(job.get('context_len'))}")


#: Why a compiled job's FLOPs read "?" (collectors/flops.py: the FLOP meter's dispatch mode
#: would make compiled frames recompile or run eagerly, so it never counts such a job).
NOT_MEASURED_COMPILED = "FLOPs not measured under torch.compile (counting would recompile it): "


def render_throughput(ranks: list[RankThroughput], job: dict[str, Any]) -> list[str]:
    tokens = (f"{si(job.get('tokens_per_s'), 'tokens/s')}, "
              if job.get("tokens_per_s") is not None else "")
    est = job.get("estimated_ranks") or 0
    head = (f"job (estimated: {job.get('ranks')}/{job.get('world')} ranks answered, each of "
            f"the other {est} counted as their median)" if est else "job")
    lines = [
        f"{head}: {tokens}"
        f"{si(job.get('samples_per_s'), 'samples/s')}, {si(job.get('flops_per_s'), 'FLOP/s')}, "
        f"MFU {pct(job.get('mfu'))}" + ("" if tokens else " (tokens/s: see GB_tok)"),
        _gb_tok(job),
        f"  data-parallel world {job.get('dp_world')}: {job.get('dp_source')}"
        + (f" (tensor-parallel {job.get('tp')}, pipeline-parallel {job.get('pp')})"
           if (job.get("tp") or 1) * (job.get("pp") or 1) > 1 else ""),
    ]
    lines += schedule_lines(job.get("schedule") or [])
    for t in ranks:
        r = t.row
        lines += [
            "",
            f"rank {t.rank} (last {r.get('steps')} steps to step {r.get('last_step')}, median "
            f"{_or(r.get('step_ms'))} ms): "
            + (f"{si(r.get('tokens_per_s'), 'tokens/s')}, "
               if r.get("tokens_per_s") is not None else "")
            + f"{si(r.get('samples_per_s'), 'samples/s')}, "
            + (f"{r.get('tokens')} tokens/step ({_or(r.get('tokens_source'))})"
               if r.get("tokens") is not None else "no token count (see GB_tok)"),
            (f"  FLOPs/token {si(r.get('flops_per_token'))} measured vs "
             f"{si(r.get('flops_6n_per_token'))} 6N; " if r.get("tokens") is not None else "  ")
            + (NOT_MEASURED_COMPILED if r.get("compiled") and r.get("flops") is None else "")
            + f"achieved {si(r.get('flops_per_s'), 'FLOP/s')}"
            f" in {_or(r.get('compute_dtype'), 'an unknown dtype')}; MFU {pct(t.mfu)} of "
            f"{si(t.peak, 'FLOP/s')} "
            f"({t.peak_source or 'no peak known: --peak-tflops'})",
        ]
        if r.get("measured_step") is not None:
            lines.append(f"  FLOPs measured on step {r.get('measured_step')} "
                         f"({r.get('measurements')}x): {r.get('measured_step_ms')} ms, "
                         f"x{r.get('measured_cost_x')} an ordinary step")
        if t.shares:
            parts = ", ".join(f"{k} {pct(t.shares.get(k))}" for k in SHARES)
            lines.append(f"  step ({r.get('traced_steps')} traced): {parts}")
        else:
            lines.append("  step breakdown: no traced steps in the window (`probe trace every "
                         "10`)")
        if t.pauses:
            lines.append(f"  pauses (share of the {r.get('steps')} steps' wall time): "
                         f"checkpoint {pct(t.pauses.get('checkpoint'))} "
                         f"({r.get('checkpoint_steps')} steps), eval "
                         f"{pct(t.pauses.get('eval'))} ({r.get('eval_steps')} steps)")
        lv = t.lever()
        if lv is None:
            lines.append("  lever: none stands out (compute dominates the step)")
        else:
            lines.append(f"  lever: {lv[0]} ({pct(lv[1])}): {lv[2]}")
            lines.append(f"  next: {t.next(lv[0])}")
    return lines


def _steps_tokens(steps: Any, tokens: Any) -> str:
    return f"step {steps}" + (f" = {si(tokens, 'tokens')}" if tokens is not None else "")


def schedule_lines(blocks: list[dict[str, Any]]) -> list[str]:
    """The LR schedule beside GB_tok (diagnose/schedule.py)."""
    if not blocks:
        return ["  schedule: not read yet (read at the first optimizer step, then steps 10, "
                "100, ...)"]
    out = []
    for b in blocks:
        if b.get("scheduler") is None:
            out.append(f"  schedule: {b.get('note') or 'no LR scheduler'}"
                       + _observed_line(b.get("observed")))
            continue
        head = f"  schedule: {b['scheduler']} ({b.get('location')}), {b.get('kind')}, " \
               f"{b.get('method')}"
        parts = []
        if b.get("warmup_steps"):
            parts.append(f"warmup to {_steps_tokens(b['warmup_steps'], b.get('warmup_tokens'))}")
        if b.get("end_step") is not None:
            parts.append(f"decay ends at {_steps_tokens(b['end_step'], b.get('end_tokens'))}"
                         + (f" ({si(b['decay_tokens'], 'tokens')} of decay)"
                            if b.get("decay_tokens") is not None else ""))
        if b.get("total_steps") is not None:
            parts.append(f"job total {_steps_tokens(b['total_steps'], b.get('total_tokens'))} "
                         f"({b.get('total_source')})")
        out.append(head + (": " + "; ".join(parts) if parts else ""))
        if b.get("note"):
            out.append(f"    note: {b['note']}")
        if b.get("check"):
            out.append(f"    CHECK: {b['check']}")
    return out


def _observed_line(o: dict[str, Any] | None) -> str:
    """What the loop that sets the LR itself did, as recorded (diagnose/schedule._observed)."""
    if not o:
        return " (no LR recorded yet)"
    first, peak, last = o["lr_first"], o["lr_peak"], o["lr_last"]
    if first == peak == last:  # held: nothing sets it, the loop included
        return (f"; the LR is constant: {first:.3g} from step {o['lr_first_step']} to step "
                f"{o['lr_last_step']}")
    text = f"; the loop sets the LR itself: {first:.3g} at step {o['lr_first_step']}"
    if o.get("warmup_steps"):
        seen = _steps_tokens(o["warmup_steps"], o.get("warmup_tokens"))
        text += f", rose to {peak:.3g} by {seen} (the warmup seen)"
    elif peak != first:
        text += f", peak {peak:.3g} at step {o['lr_peak_step']}"
    if last != peak or o["lr_last_step"] != o["lr_peak_step"]:
        trend = "falling" if last < peak else "at its peak" if last == peak else "rising"
        text += f", {last:.3g} at step {o['lr_last_step']} ({trend})"
    return text + " (probe query \"SELECT step, lr FROM python.step_stats\")"
