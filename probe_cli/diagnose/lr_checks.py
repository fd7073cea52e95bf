"""`probe doctor`'s learning-rate block: each rank's optimizer settings and clipping as evidence;
problems: ranks that disagree, a DeepSpeed fp16 scaler that skips most steps, a non-finite or
zero LR nobody explained, clip_grad_norm_ called on still-scaled gradients (CLIPPING SCALED
GRADIENTS), a loop that sets its own LR. Clipping by cause is clipping.py's. Pure; see
time_checks.py for the shape of a check.
"""

from __future__ import annotations

import math
from typing import Any

from ..group import rank_label
from .checks import DoctorCheck, Evidence
from .clipping import legacy_clip
from .findings import INFO, WARNING, Finding, RankDoc, Report, first_loop, num

#: Clipping on at least this share of the steps that clipped at all: the LR may be too high.
CLIP_SHARE = 0.9
#: The LR moved on at least this share of the steps, with no scheduler: the loop sets it.
OWN_LR_SHARE = 0.5

def _optimizer_line(state: dict[str, Any]) -> str:
    parts = []
    for o in state.get("optimizers") or []:
        groups = o.get("groups") or []
        lrs = sorted({_fmt(g.get("lr")) for g in groups if g.get("lr") is not None})
        extra = [f"{k} {groups[0][k]}" for k in ("momentum", "weight_decay", "betas")
                 if groups and k in groups[0]]
        parts.append(f"{o.get('class')} lr {', '.join(lrs) or '?'} "
                     f"({len(groups)} group{'s' if len(groups) != 1 else ''}"
                     f"{', ' if extra else ''}{', '.join(extra)})")
    return "; ".join(parts)


#: Findings that name their own cause and next step for the LR or clipping: the LR info block
#: then suggests no LR change (doctor must never contradict itself).
LR_SAID = frozenset({"amp_clip", "clipping", "lr_zero", "spike", "diverging", "not_learning",
                     "stalled", "lr_high", "nonfinite"})


def check_lr_clip(report: Report, docs: list[RankDoc], clip_said: bool | None = None,
                  zero_said: bool | None = None) -> None:
    """The optimizers' settings and clipping as evidence; problems: ranks that disagree, a
    DeepSpeed fp16 scaler that skips most steps, a non-finite LR. Clipping itself is judged by
    numerics.check_clipping (``clip_said``: it did, from the per-step norms), an LR of 0 by
    numerics.check_lr_zero (``zero_said``); both are read off the report and the ranks'
    evidence when not given."""
    if clip_said is None:
        clip_said = any(num(r.get("clip_max_norm")) is not None
                        for d in docs for r in d.rows("numerics") or [])
    if zero_said is None:
        zero_said = any(f.check == "lr_zero" for f in report.findings)
    lines = {d.rank: _optimizer_line(d.state) for d in docs if d.state}
    lines = {r: x for r, x in lines.items() if x}
    if not lines:
        report.unchecked.append("learning rate: " + _no_settings(docs))
        return
    evidence = [f"{rank_label(rs)}: {x}" for x, rs in _by_value(lines)]
    problems, ranks, scaled = [], set(), {}
    ds_lines: dict[str, list[int]] = {}
    clips_most = False  # a rank clips on most steps: its cause is clipping.py's to judge
    for d in docs:
        loop = first_loop(d)
        clip_steps = int(num(loop.get("clip_steps")) or 0)
        ds = (d.state or {}).get("deepspeed")
        if ds:
            problem = _deepspeed_lines(d.rank, ds, ds_lines)
            if problem:
                problems.append(problem)
                ranks.add(d.rank)
        n_scaled = int(num(loop.get("scaled_clip_steps")) or 0)
        med = num(loop.get("grad_norm_median"))
        if clip_steps and 2 * n_scaled >= clip_steps:
            # The clip saw gradients times the scale: its norm and its clipping say nothing
            # about the LR (minGPT-ddp: "LR too high" from a norm of 4.59e+04 that was 0.7).
            scaled[d.rank] = loop
            evidence.append(
                f"rank {d.rank}: clip_grad_norm_(max_norm={loop.get('clip_max_norm')}) ran "
                f"on {clip_steps} of the last {loop.get('steps')} steps, {n_scaled} of them "
                f"on gradients still scaled by the GradScaler "
                f"(x{num(loop.get('grad_scale')) or 0:.0f}); median norm "
                f"{_g(num(loop.get('unscaled_norm_median')))} unscaled "
                f"({_g(med)} as the clip saw it)")
        elif clip_steps:
            clipped = int(num(loop.get("clipped_steps")) or 0)
            evidence.append(f"rank {d.rank}: clip_grad_norm_(max_norm={loop.get('clip_max_norm')}"
                            f") ran on {clip_steps} of the last {loop.get('steps')} steps and "
                            f"clipped {clipped}" + (f"; median norm before clipping {med:.3g}"
                                                    if med is not None else ""))
            finite = int(num(loop.get("clip_finite_steps", clip_steps)) or 0)
            most = clipped >= CLIP_SHARE * finite and finite >= 5
            clips_most |= most
            if most and not clip_said:
                legacy_clip(report, d.rank, clipped, finite, med,
                             num(loop.get("clip_max_norm")))
        elif loop and not ds:  # DeepSpeed clips inside engine.step(): said above
            evidence.append(f"rank {d.rank}: clip_grad_norm_ not called")
        for o in (d.state or {}).get("optimizers") or []:
            for g in o.get("groups") or []:
                lr = num(g.get("lr"))
                if lr is not None and lr == 0 and zero_said:
                    continue
                if lr is not None and (lr == 0 or not math.isfinite(lr)):
                    problems.append(f"rank {d.rank}: {o.get('class')} lr is {g.get('lr')}")
                    ranks.add(d.rank)
    evidence += [f"{rank_label(rs)}: {line}" for line, rs in ds_lines.items()]
    own = _loop_sets_lr(docs)
    disagree = _settings_disagree(docs, loop_sets_lr=bool(own))
    if disagree:
        problems.append("ranks disagree on optimizer settings")
        ranks.update(disagree)
    if own:
        evidence.append(own)
    if scaled:
        _scaled_clip_finding(report, scaled)
    # no "lower it" how-to beside a clip on most steps: when the per-step norms were not read
    # (a timeout under load), clipping.py could not say whether the LR is the cause, and the
    # how-to read as advice (num_clip_mild, a healthy trim, once got "probe lr --scale 0.5")
    said = any(f.check in LR_SAID for f in report.findings) or clips_most
    if problems:
        report.findings.append(Finding(
            WARNING, "lr", "LEARNING RATE: " + "; ".join(dict.fromkeys(problems)), evidence,
            _OWN_LR_NEXT if own else "probe lr   # each rank's LR; --set LR to make them agree",
            sorted(ranks), score=0.5))
    else:
        report.findings.append(Finding(INFO, "lr", "learning rate and clipping", evidence,
                                       _OWN_LR_NEXT if own else "" if said else
                                       "probe lr --scale 0.5   # to lower it mid-run"))


def _no_settings(docs: list[RankDoc]) -> str:
    """Why no optimizer settings were read. A post-mortem copy (or a rank whose live state did
    not answer) has no settings, but its steps may be many: "no optimizer has stepped yet"
    was printed after 216-4731 recorded steps."""
    stepped = [(d, first_loop(d)) for d in docs if num(first_loop(d).get("steps"))]
    if not stepped:
        asked = sorted({e for d in docs for e in (d.errors.get("state"), d.errors.get("loop"))
                        if e})
        if asked:  # the ranks did not answer (a timeout on a busy node): nothing is known
            return f"optimizer settings and steps not read ({asked[0]})"
        return "no optimizer has stepped yet (or torch.optim is not used)"
    d, loop = stepped[0]
    why = d.errors.get("state") or "the optimizers' settings are read live, not kept in a copy"
    a, b = num(loop.get("lr_first")), num(loop.get("lr_last"))
    lr = (f"; the LR recorded went {a:.4g} -> {b:.4g}" if a is not None and b is not None
          else "")
    return (f"optimizer settings not read ({why}); rank {d.rank} recorded "
            f"{int(num(loop.get('steps')) or 0)} steps to step {loop.get('last_step')}{lr}")


#: What to change when the loop computes its LR itself (`probe lr` would be undone next step).
_OWN_LR_NEXT = ("edit the LR the training script computes each step (its peak/max LR): the "
                "loop overwrites an LR changed from outside at its next step")


def _loop_sets_lr(docs: list[RankDoc]) -> str:
    """Evidence that the training loop sets the LR itself each step (nanoGPT's ``get_lr``): no
    LR scheduler steps its optimizers, yet the LR moved on at least ``OWN_LR_SHARE`` of the
    window's steps. Empty otherwise (a constant LR, a scheduler, an agent that does not report
    its schedulers, or a few changes: one `probe lr` moved a held LR once, and read as "the loop
    sets it itself" on word_language_model)."""
    moved = []
    for d in docs:
        state = d.state or {}
        if state.get("schedulers") is None or state["schedulers"]:
            return ""
        loop = first_loop(d)
        a, b = num(loop.get("lr_first")), num(loop.get("lr_last"))
        changes, steps = num(loop.get("lr_changes")) or 0, num(loop.get("steps")) or 0
        if a is not None and b is not None and changes >= max(3, OWN_LR_SHARE * steps):
            moved.append((d.rank, a, b, loop.get("steps")))
    if not moved:
        return ""
    r, a, b, n = moved[0]
    # digits enough to show the move: a cosine barely past its peak read "0.0006 -> 0.0006"
    digits = next((k for k in range(4, 10) if f"{a:.{k}g}" != f"{b:.{k}g}"), 4)
    return (f"{rank_label([m[0] for m in moved])}: no LR scheduler, yet the LR moved "
            f"on most steps (rank {r}: {a:.{digits}g} -> {b:.{digits}g} over {n} steps): the "
            "training loop sets it itself")


def _scaled_clip_finding(report: Report, scaled: dict[int, dict[str, Any]]) -> None:
    ranks = sorted(scaled)
    loop = scaled[ranks[0]]
    scale = num(loop.get("grad_scale")) or 0.0
    evidence = [
        f"rank {r}: clip_grad_norm_ ran on {int(num(x.get('scaled_clip_steps')) or 0)} steps with"
        f" gradients scaled by x{num(x.get('grad_scale')) or 0:.0f}: norm as the clip saw it "
        f"{_g(num(x.get('grad_norm_median')))}, unscaled {_g(num(x.get('unscaled_norm_median')))}"
        f" (max_norm {x.get('clip_max_norm')})" for r, x in sorted(scaled.items())]
    evidence.append(f"the clip compares a norm x{scale:.0f} too large with max_norm, so each "
                    "update is cut down far more than meant; the LR is not the problem")
    report.findings.append(Finding(
        WARNING, "amp_clip", f"CLIPPING SCALED GRADIENTS: {rank_label(ranks)} "
        f"{_verb(ranks, 'calls', 'call')} clip_grad_norm_ before scaler.unscale_: the norm is "
        f"x{scale:.0f} (unscaled {_g(num(loop.get('unscaled_norm_median')))}); call "
        "scaler.unscale_(optimizer) first", evidence,
        "in the training script: scaler.unscale_(optimizer) right before clip_grad_norm_",
        ranks, score=0.6))


def _g(v: float | None) -> str:
    return "?" if v is None else f"{v:.3g}"


#: A DeepSpeed fp16 job whose loss scaler skipped more than this share of its steps (after
#: ``_SKIP_MIN_STEPS``: the scale settles over the first few) is not training.
_SKIP_SHARE, _SKIP_MIN_STEPS = 0.5, 20


def _deepspeed_lines(rank: int, ds: dict[str, Any], lines: dict[str, list[int]]) -> str | None:
    """Evidence about DeepSpeed's clipping, loss scaler and accumulation (``line -> ranks``);
    a problem line when its fp16 loss scaler skips most steps."""
    clip = num(ds.get("gradient_clipping"))
    said = [f"DeepSpeed clips gradients inside engine.step() (gradient_clipping={clip:g}; "
            "clip_grad_norm_ is not used)" if clip else
            "DeepSpeed gradient_clipping is off (0); set it in the DeepSpeed config to clip"]
    accum = int(num(ds.get("gradient_accumulation_steps")) or 1)
    if accum > 1:
        said.append(f"gradient accumulation {accum}: one optimizer step every {accum} micro "
                     "batches (steps are the engine's global_steps)")
    problem = None
    if ds.get("fp16"):
        steps = int(num(ds.get("global_steps")) or 0)
        skipped = int(num(ds.get("skipped_steps")) or 0)
        scale = num(ds.get("loss_scale"))
        said.append((f"fp16 loss scale {scale:g}; " if scale is not None else "fp16; ")
                    + f"the scaler skipped {skipped} of {steps} steps (gradient overflow)")
        if steps >= _SKIP_MIN_STEPS and skipped > _SKIP_SHARE * steps:
            problem = (f"rank {rank}: DeepSpeed's fp16 loss scaler skipped {skipped} of {steps} "
                       "steps (gradients overflow: the weights barely change)")
    for line in said:
        lines.setdefault(line, []).append(rank)
    return problem


def _settings_disagree(docs: list[RankDoc], loop_sets_lr: bool = False) -> set[int]:
    """The ranks whose optimizer settings are not the others'. The LR is compared only between
    ranks that answered at the same step: a schedule moves it every step (a healthy cosine
    job, its ranks one step apart, read as "ranks disagree"); elsewhere only a factor of 1.5
    or more counts (one rank lowered by `probe lr`, the others not). A loop that sets its own
    LR does so before the step the clock counts, so two ranks at the same count may hold the
    LRs of two steps: then only the factor counts."""
    shape: dict[int, tuple[Any, ...]] = {}
    lrs: dict[int, tuple[float, ...]] = {}
    steps: dict[int, Any] = {}
    for d in docs:
        opts = (d.state or {}).get("optimizers") or []
        if not opts:
            continue
        shape[d.rank] = tuple(
            (o.get("class"), len(o.get("groups") or []),
             *(tuple(sorted((k, str(g.get(k))) for k in ("momentum", "weight_decay", "betas")
                            if k in g)) for g in (o.get("groups") or [])[:1]))
            for o in opts)
        lrs[d.rank] = tuple(num(g.get("lr")) or 0.0 for o in opts for g in o.get("groups") or [])
        steps[d.rank] = ((d.state or {}).get("clock") or {}).get("step")
    out: set[int] = set()
    if len(set(shape.values())) > 1:
        out.update(shape)
    for a in lrs:
        for b in lrs:
            if a >= b or shape[a] != shape[b] or len(lrs[a]) != len(lrs[b]):
                continue
            same_step = not loop_sets_lr and steps[a] is not None and steps[a] == steps[b]
            for x, y in zip(lrs[a], lrs[b]):
                lo, hi = sorted((abs(x), abs(y)))
                if (same_step and not math.isclose(x, y, rel_tol=1e-6)) or hi > 1.5 * lo:
                    out.update((a, b))
    return out


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _verb(ranks: Any, one: str, many: str) -> str:
    return one if len(set(ranks)) == 1 else many


def _by_value(values: dict[int, str]) -> list[tuple[str, list[int]]]:
    out: dict[str, list[int]] = {}
    for r, v in sorted(values.items()):
        out.setdefault(v, []).append(r)
    return list(out.items())



#: The check of this module, for doctor.py's registry (checks.py).
CHECKS = (
    DoctorCheck("lr_clip", 90, lambda report, ctx: check_lr_clip(report, ctx.docs),
                evidence=(Evidence("loop", "doctor_loop", lambda last: {"last": last}),)),
)
