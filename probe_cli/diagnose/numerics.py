"""Training numerics verdicts: LOSS SPIKE, NaN/Inf origin, DIVERGING / NOT LEARNING, STALLED,
LR TOO HIGH, CLIPPING and LR ZERO (a schedule that ended). Pure: each rank's ``numerics`` rows
(the canned query of that name: loss, gradient norm, max_norm, LR and update ratios per step),
its ``numeric_events`` (spike and non-finite captures, the NaN origin) and its ``/v1/numerics``
state (the thresholds, the first non-finite step) in; ``Finding``s out. Used by `probe doctor`
and `probe numerics` alike, so they cannot disagree.

Robust statistics only (medians, MADs): a busy machine or one odd batch must not turn a healthy
job into a finding. The thresholds live in the agents (``GET/POST /v1/numerics``), settable
while the job runs; the defaults are in probe_agent/collectors/numerics.py.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from probe_protocol import loss_spike

from ..group import rank_label
from .checks import DoctorCheck, Evidence
from .findings import CRITICAL, WARNING, Finding, RankDoc, Report, num

#: The agents' defaults, for ranks that predate them (kept equal to collectors/numerics.py).
DEFAULTS = {"spike_factor": 2.0, "spike_mads": 5.0, "clip_share": 0.5, "clip_far": 3.0,
            "stall_ratio": 1e-4, "high_ratio": 1e-1, "chance_margin": 0.1}
#: Steps of each rank's recent history the numerics verdicts look at (and its first 20).
TREND_WINDOW = 500
#: Losses before a step that its spike check reads (probe_protocol/loss_spike.py).
SPIKE_WINDOW = loss_spike.WINDOW
#: Steps a trend verdict (diverging, stalled, not learning) needs in the window.
TREND_STEPS = 60
#: Norms this many times higher at the window's end than at its start are "growing".
GROWING = 2.0


def thresholds(docs: list[RankDoc]) -> dict[str, float]:
    """The thresholds the ranks hold (rank order: the first rank's when they differ)."""
    for d in docs:
        t = ((d.state or {}).get("numerics") or {}).get("thresholds")
        if t:
            return {**DEFAULTS, **{k: float(v) for k, v in t.items() if num(v) is not None}}
    return dict(DEFAULTS)


def _rows(d: RankDoc) -> list[dict[str, Any]]:
    return [r for r in d.rows("numerics") or [] if r.get("step") is not None]


def _finite(xs: list[Any]) -> list[float]:
    out = []
    for x in xs:
        v = num(x)
        if v is not None and math.isfinite(v):
            out.append(v)
    return out


def spikes(rows: list[dict[str, Any]], t: dict[str, float]) -> list[dict[str, Any]]:
    """Steps whose loss is a spike over the finite losses before it: ``spike_factor`` x their
    recent level and ``spike_mads`` robust deviations above it, on the log of the loss (the
    agent's rule too: probe_protocol/loss_spike.py)."""
    out: list[dict[str, Any]] = []
    before: list[float] = []
    for r in rows:
        loss = num(r.get("loss"))
        if loss is None or not math.isfinite(loss):
            continue
        found = loss_spike.spike(before, loss, t["spike_factor"], t["spike_mads"])
        if found:
            out.append({"step": int(r["step"]), "loss": loss, "median": found[1],
                        "factor": found[0]})
        before.append(loss)
        del before[:-SPIKE_WINDOW]
    return out


def check_numerics(report: Report, docs: list[RankDoc]) -> None:
    """Every numerics verdict over the ranks' rows (see the module docstring)."""
    t = thresholds(docs)
    have = [d for d in docs if _rows(d)]
    if not have:
        why = next((d.errors.get("numerics") for d in docs if d.errors.get("numerics")), None)
        report.unchecked.append(f"loss and gradients: {why or 'no steps recorded yet'}")
        return
    _spike(report, have, t)
    _trend(report, have, t)
    losses = [r for d in have for r in _rows(d) if num(r.get("loss")) is not None]
    if losses and not any(f.check in ("spike", "diverging", "stalled", "not_learning",
                                      "lr_high", "nonfinite") for f in report.findings):
        d = have[0]
        rows = _rows(d)
        a, b = _edge(rows, first=True), _edge(rows, first=False)
        report.fine.append(f"loss: no spike, divergence or stall (rank {d.rank}: "
                           f"{fmt4(a)} -> {fmt4(b)} over steps "
                           f"{rows[0]['step']}-{rows[-1]['step']})")


def _edge(rows: list[dict[str, Any]], first: bool, n: int = 10) -> float | None:
    xs = _finite([r.get("loss") for r in rows])
    part = xs[:n] if first else xs[-n:]
    return statistics.median(part) if part else None


def _spike(report: Report, docs: list[RankDoc], t: dict[str, float]) -> None:
    found = [(d, s) for d in docs for s in spikes(_rows(d), t)]
    if not found:
        return
    d, s = max(found, key=lambda x: x[1]["factor"])
    ranks = sorted({x.rank for x, _ in found})
    evidence = [f"rank {d.rank} step {s['step']}: loss {s['loss']:.4g} = x{s['factor']:.1f} "
                f"the level {s['median']:.4g} of the steps before (median of the last "
                f"{loss_spike.LEVEL})"]
    others = [f"rank {x.rank} step {y['step']} x{y['factor']:.1f}" for x, y in found
              if (x, y) != (d, s)]
    if others:
        evidence.append(f"{len(others)} more: " + ", ".join(others[:6]))
    after = [num(r.get("loss")) for r in _rows(d) if r["step"] > s["step"]][:20]
    after_f = _finite(after)
    if after_f:
        back = statistics.median(after_f)
        evidence.append(f"after it the loss went back to {back:.4g} (median of the next "
                        f"{len(after_f)} steps)" if back < 1.5 * s["median"] else
                        f"after it the loss stayed up ({back:.4g}, median of the next "
                        f"{len(after_f)} steps)")
    answered = d.rows("numeric_events")
    evs = [e for e in answered or [] if e.get("step") == s["step"] and
           e.get("kind") == "anomaly"]
    jumped = []
    for e in evs:
        g, base = num(e.get("grad_norm")), num(e.get("baseline"))
        if e.get("module") != "(total)" and g is not None and base:
            jumped.append((g / base, e["module"], g, base))
    if jumped:
        jumped.sort(reverse=True)
        evidence.append("gradients that jumped most: " + ", ".join(
            f"{m} x{f:.1f} ({g:.3g} vs median {b:.3g})" for f, m, g, b in jumped[:3]))
    samples = next((e.get("samples") for e in evs if e.get("module") == "(total)"
                    and e.get("samples")), None)
    if samples:
        evidence.append(f"the batch: DataLoader sample indices {samples}")
    elif answered is None:  # not read (a timeout on a busy machine): say so, claim nothing
        why = d.errors.get("numeric_events") or "no answer"
        evidence.append(f"the batch and the modules: rank {d.rank}'s anomaly rows were not "
                        f"read ({why}); probe numerics again")
    elif evs:
        evidence.append("the batch: no DataLoader sample indices (the loop does not iterate a "
                        f"DataLoader); it was step {s['step']}'s batch")
    else:
        evidence.append(f"the batch: not captured (the agent keeps the first 20 spikes and "
                        f"non-finite steps); it was step {s['step']}'s batch")
    report.findings.append(Finding(
        WARNING, "spike", f"LOSS SPIKE: rank {d.rank} step {s['step']}: loss x{s['factor']:.1f} "
        f"its recent median ({s['median']:.4g} -> {s['loss']:.4g})", evidence,
        "look at those samples; to skip such steps from now on: probe guard --skip-spike "
        f"{max(t['spike_factor'], 3.0):g}", ranks, score=s["factor"],
        detail={"step": s["step"], "rank": d.rank, "factor": round(s["factor"], 3),
                "samples": samples, "modules": [m for _, m, _, _ in jumped[:3]]}))


def _trend(report: Report, docs: list[RankDoc], t: dict[str, float]) -> None:
    """DIVERGING, NOT LEARNING, STALLED and LR TOO HIGH, one finding per kind over the ranks."""
    verdicts: dict[str, list[tuple[RankDoc, str, dict[str, Any]]]] = {}
    for d in docs:
        rows = [r for r in _rows(d) if not r.get("nonfinite")]
        losses = _finite([r.get("loss") for r in rows])
        if len(losses) < TREND_STEPS:
            continue
        half = rows[-(len(rows) // 2):]
        ratios = _finite([r.get("update_ratio") for r in half])
        ratio = statistics.median(ratios) if ratios else None
        tops = _finite([r.get("max_ratio") for r in half])
        top = statistics.median(tops) if tops else None  # the module that moves most
        lrs = _finite([r.get("lr") for r in rows[-10:]])
        if lrs and max(lrs) == 0:
            continue  # the LR ZERO finding says it
        start, recent = statistics.median(losses[:10]), statistics.median(losses[-10:])
        q = len(losses) // 4
        quarters = [statistics.median(losses[i * q:(i + 1) * q]) for i in range(4)]
        best = min(statistics.median(losses[i:i + 10]) for i in range(0, len(losses) - 9))
        classes = num(((d.state or {}).get("numerics") or {}).get("classes"))
        chance = math.log(classes) if classes and classes > 1 else None
        margin = t["chance_margin"] * chance if chance is not None else 0.0

        def near(x: float, chance: float | None = chance, margin: float = margin) -> bool:
            return chance is not None and abs(x - chance) <= margin
        norms = [(num(r.get("grad_norm")), num(r.get("clip_max_norm"))) for r in half]
        clipped = [g > m for g, m in norms if g is not None and m is not None and
                   math.isfinite(g)]
        hard_clip = len(clipped) >= 5 and sum(clipped) >= t["clip_share"] * len(clipped)
        blow = _blow_up(rows, losses, t)
        info = {"start": start, "recent": recent, "best": best, "ratio": ratio, "top": top,
                "chance": chance, "steps": (rows[0]["step"], rows[-1]["step"]),
                "hard_clip": hard_clip, "blow_up": blow, "decay_only": _decay_only(d, ratio)}
        # a blow-up explains a loss that does not learn (or rises) now, however still the
        # weights are since: the units it killed move only by weight decay
        high = (top is not None and top > t["high_ratio"]) or (
            blow is not None and (near(recent) or recent >= 0.9 * blow["first"]))
        low = min(quarters[:3])
        last_q = losses[3 * q:]
        # A rise, not noise: the last quarter above the best earlier quarter by 30%, rising,
        # and nearly all of its losses above that quarter's median (random batches put half)
        above = sum(1 for x in last_q if x > low) / max(1, len(last_q))
        rising = quarters[3] > quarters[2] and quarters[3] > 1.3 * low and above >= 0.9
        if rising or (near(recent) and best < 0.7 * recent):
            verdicts.setdefault("diverging", []).append((d, "rising", info))
        elif ratio is not None and ratio < t["stall_ratio"] and recent >= 0.97 * quarters[1]:
            verdicts.setdefault("stalled", []).append((d, "flat", info))
        elif near(recent) and (chance is None or best >= 0.9 * chance):
            verdicts.setdefault("not_learning", []).append((d, "chance", info))
        if high:
            verdicts.setdefault("lr_high", []).append((d, "ratio", info))
    for kind, items in verdicts.items():
        report.findings.append(_trend_finding(kind, items, t))


def _blow_up(rows: list[dict[str, Any]], losses: list[float],
             t: dict[str, float]) -> dict[str, Any] | None:
    """An LR far too high from the first steps: in the first quarter of the rows, a traced step
    on which the median module moved its weights by more than ``high_ratio`` of their norm
    (every module at once: one zero-initialised module does not count), and a loss above
    ``spike_factor`` x the first loss recorded. Later ratios may look normal by then: the
    weights grew (the ratio is relative) or the units died."""
    early = rows[:max(1, len(rows) // 4)]
    moved = [(v, r["step"]) for r in early
             if (v := num(r.get("update_ratio"))) is not None and math.isfinite(v)]
    first = losses[0] if losses else None
    jumps = [(v, r["step"]) for r in early
             if (v := num(r.get("loss"))) is not None and math.isfinite(v)]
    if not moved or not jumps or first is None or first <= 0:
        return None
    ratio, at = max(moved)
    peak, peak_at = max(jumps)
    if ratio <= t["high_ratio"] or peak <= t["spike_factor"] * first:
        return None
    return {"ratio": ratio, "at": at, "first": first, "peak": peak, "peak_at": peak_at}


def _decay_only(d: RankDoc, ratio: float | None) -> float | None:
    """lr x weight_decay when the median update ratio equals it (within 5%): only decoupled
    weight decay moves the weights, the gradients' part of the update is gone (dead units)."""
    groups = [g for o in (d.state or {}).get("optimizers") or [] for g in o.get("groups") or []]
    if ratio is None or not groups:
        return None
    lr, wd = num(groups[0].get("lr")), num(groups[0].get("weight_decay"))
    if not lr or not wd:
        return None
    return lr * wd if abs(ratio - lr * wd) <= 0.05 * lr * wd else None


def own_lr(d: RankDoc) -> bool:
    """No scheduler, yet the LR moved on most steps: the loop sets it (nanoGPT's get_lr)."""
    if (d.state or {}).get("schedulers") != []:
        return False
    lrs = _finite([r.get("lr") for r in _rows(d)])
    moves = sum(1 for p, n in zip(lrs, lrs[1:]) if p != n)
    return len(lrs) >= 6 and moves >= max(3, len(lrs) // 2)


def lr_next(scale: float, own: bool) -> str:
    """The next step that changes the LR by ``scale``: `probe lr`, unless the loop sets the LR
    itself each step and would undo it (then doctor said `probe lr --scale 10` in one finding
    and "the loop overwrites an LR changed from outside" in its LR block)."""
    if not own:
        return f"probe lr --scale {scale:g}"
    return (f"{'raise' if scale > 1 else 'lower'} the peak LR the training script computes "
            f"each step (x{scale:g}): the loop overwrites an LR changed from outside at its "
            "next step")


def _trend_finding(kind: str, items: list[tuple[RankDoc, str, dict[str, Any]]],
                   t: dict[str, float]) -> Finding:
    ranks = sorted(d.rank for d, _, _ in items)
    d, _, x = items[0]
    a, b = x["steps"]
    ratio = x["ratio"]
    rtext = f"median update/weight ratio {ratio:.2g} per step" if ratio is not None else \
        "no update ratios yet (they come from traced steps: probe trace every 10)"
    loss = (f"rank {d.rank}: loss {x['start']:.4g} at the start, best {x['best']:.4g}, "
            f"{x['recent']:.4g} now (steps {a}-{b}, medians of 10 steps)")
    chance = (f"chance level for {round(math.exp(x['chance']))} classes: ln = {x['chance']:.4g}"
              if x["chance"] is not None else None)
    top = x["top"]
    blow = x.get("blow_up")
    high = (top is not None and top > t["high_ratio"]) or (
        blow is not None and kind in ("lr_high", "not_learning", "diverging"))
    low = ratio is not None and ratio < t["stall_ratio"] and blow is None
    ev = [loss, f"rank {d.rank}: {rtext}" + (f", {top:.2g} in the module that moves most"
                                                if top is not None else "") +
          f" (healthy is around 1e-3; above {t['high_ratio']:g} the LR is far too high, below "
          f"{t['stall_ratio']:g} far too low)"]
    if chance:
        ev.append(chance)
    if blow:
        ev.append(f"rank {d.rank}: early on the LR blew the weights up: at step {blow['at']} the "
                  f"median module moved by {blow['ratio']:.2g} of its norm in one step, and the "
                  f"loss jumped to {blow['peak']:.4g} at step {blow['peak_at']} "
                  f"(x{blow['peak'] / blow['first']:.1f} the first loss, {blow['first']:.4g})")
    if x.get("decay_only"):
        ev.append(f"rank {d.rank}: the median update ratio is lr x weight_decay "
                  f"({x['decay_only']:.2g}): only weight decay moves the weights, the gradients "
                  "vanished (dead units)")
    own = own_lr(d)
    restart = ("restart from before the blow-up with a 10x lower LR (or a warmup): units it "
               "killed do not come back" + ("" if own else
                                            "; probe lr --scale 0.1 only keeps it from going on"))
    who = rank_label(ranks)
    if kind == "diverging":
        title = f"DIVERGING: {who}: the loss rose from {x['best']:.4g} to {x['recent']:.4g}"
        if x.get("hard_clip") and not high:  # every update clipped, yet the loss climbs
            ev.append(f"rank {d.rank}: clip_grad_norm_ cuts most updates, and the loss still "
                      "climbs: each step is too big")
            high = True
        nxt = (lr_next(0.1, own) if high else "the LR is not the cause (update ratios are "
               "in range): check the data and the loss since the turn; probe numerics")
        return Finding(CRITICAL if high else WARNING, kind, title + (
            ": the LR is too high" if high else ""), ev, nxt, ranks, score=x["recent"])
    if kind == "not_learning":
        title = (f"NOT LEARNING: {who}: the loss sits at chance level ({x['recent']:.4g}, "
                 f"ln of {round(math.exp(x['chance']))} classes = {x['chance']:.4g}) since "
                 f"step {a}")
        nxt = (restart if blow else lr_next(0.1, own)) if high else (
            lr_next(10, own) if low else "check the labels and the loss function (the LR "
            "moves the weights normally)")
        return Finding(WARNING, kind, title, ev, nxt, ranks, score=1.0)
    if kind == "stalled":
        at = (f" (chance level for {round(math.exp(x['chance']))} classes)"
              if x["chance"] is not None and abs(x["recent"] - x["chance"]) <= 0.1 * x["chance"]
              else "")
        title = (f"STALLED: {who}: the loss is flat at {x['recent']:.4g}{at} and the weights "
                 f"barely move ({rtext}): the LR is far too low")
        return Finding(WARNING, kind, title, ev, lr_next(10, own), ranks, score=0.8)
    if blow and not (top is not None and top > t["high_ratio"]):
        title = (f"LR TOO HIGH: {who}: at step {blow['at']} one step moved the weights by "
                 f"{blow['ratio']:.2g} of their norm (median module) and the loss jumped "
                 f"x{blow['peak'] / blow['first']:.1f}; it has not recovered")
        return Finding(WARNING, "lr_high", title, ev, restart, ranks, score=0.9)
    title = (f"LR TOO HIGH: {who}: each step moves a module's weights by {top:.2g} of their "
             "norm (median over the traced steps), far above the usual ~1e-3")
    return Finding(WARNING, "lr_high", title, ev, lr_next(0.1, own), ranks, score=0.9)


def fmt4(v: float | None) -> str:
    """A number in 4 significant digits, `?` when unknown (the verdicts' own style)."""
    return "?" if v is None else f"{v:.4g}"


_SERIES = Evidence("numerics", "numerics", lambda last: {"window": max(last, TREND_WINDOW)})
#: The checks of this module, for doctor.py's registry (checks.py): the loss verdicts right
#: after NaN/Inf (30); clipping.py's run before the LR block.
CHECKS = (
    DoctorCheck("numerics", 35, lambda report, ctx: check_numerics(report, ctx.docs),
                evidence=(_SERIES, Evidence("numeric_events", "numerics_events"))),
)
