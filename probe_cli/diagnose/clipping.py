"""CLIPPING judged by its cause and LR ZERO (a schedule that ended), for `probe doctor` and `probe
numerics`. Pure, over the same evidence as numerics.py (each rank's ``numerics`` rows: the
per-step gradient norm, max_norm, loss, LR and update ratios), whose helpers it uses.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..group import rank_label
from .checks import Context, DoctorCheck, Evidence
from .findings import INFO, WARNING, Finding, RankDoc, Report, num
from .numerics import (
    DEFAULTS,
    GROWING,
    TREND_WINDOW,
    _edge,
    _finite,
    _rows,
    fmt4,
    lr_next,
    own_lr,
    thresholds,
)


def check_clipping(report: Report, docs: list[RankDoc]) -> bool:
    """CLIPPING judged by its cause (one finding over the ranks; DDP ranks share gradients):
    the LR when each clipped update is still large (update/weight ratio above ``high_ratio``),
    the norms grow, or the loss does not fall although every update is cut; else max_norm far
    below the typical pre-clip norm (raise it); else a trim while the loss falls (information).
    Returns True when the ranks' per-step norms were there to judge (the LR block then says
    nothing more about clipping)."""
    t = thresholds(docs)
    judged = False
    causes: dict[str, list[tuple[RankDoc, list[str], dict[str, Any]]]] = {}
    for d in docs:
        rows = [r for r in _rows(d) if num(r.get("clip_max_norm")) is not None]
        norms = _finite([r.get("grad_norm") for r in rows])
        if len(norms) < 5:
            continue
        judged = True
        max_norm = _finite([r.get("clip_max_norm") for r in rows])[-1]
        clipped = sum(1 for x in norms if x > max_norm)
        share = clipped / len(norms)
        if share < t["clip_share"]:
            continue
        med = statistics.median(norms)
        q = max(1, len(norms) // 4)
        first, last = statistics.median(norms[:q]), statistics.median(norms[-q:])
        losses = [r for r in _rows(d) if num(r.get("loss")) is not None]
        a, b = _edge(losses, True), _edge(losses, False)
        xs = _finite([r.get("loss") for r in losses])
        best = min((statistics.median(xs[i:i + 10]) for i in range(0, max(1, len(xs) - 9))),
                   default=None) if len(xs) >= 10 else None
        # falling: below where it started and near its best (a loss that climbs back after an
        # early drop is not falling)
        falls = a is not None and b is not None and b < 0.95 * a and (
            best is None or b <= 1.2 * best)
        ratios = _finite([r.get("update_ratio") for r in _rows(d)])
        ratio = statistics.median(ratios) if ratios else None
        ev = [f"rank {d.rank}: clip_grad_norm_(max_norm={max_norm:g}) clipped {clipped} of "
              f"{len(norms)} steps; median norm before clipping {med:.3g} (x{med / max_norm:.2g}"
              f" max_norm), {first:.3g} at the window's start and {last:.3g} at its end",
              f"rank {d.rank}: loss {fmt4(a)} -> {fmt4(b)}"]
        if ratio is not None:
            ev.append(f"rank {d.rank}: median update/weight ratio {ratio:.2g} per step (healthy "
                      f"~1e-3; above {t['high_ratio']:g} the LR is far too high)")
        x = {"rank": d.rank, "share": round(share, 3), "median_norm": med,
             "max_norm": max_norm, "update_ratio": ratio, "growth": last / first if first
             else None, "falls": falls, "own_lr": own_lr(d)}
        # growing norms blame the LR only while the loss does not fall: early in a healthy run
        # the norms grow as the loss drops (num_clip_mild, num_clip_small: x2.2-2.7)
        if (ratio is not None and ratio > t["high_ratio"]) or \
                (last >= GROWING * first and not falls) or \
                (not falls and med > t["clip_far"] * max_norm):
            cause = "lr"
        elif med > t["clip_far"] * max_norm:
            cause = "max_norm"
        else:
            cause = "none"
        causes.setdefault(cause, []).append((d, ev, x))
    if "lr" in causes:  # one cause per job: the ranks share their gradients
        causes = {"lr": [i for v in causes.values() for i in v]}
    for cause, items in causes.items():
        report.findings.append(_clip_finding(cause, items))
    return judged


def _clip_finding(cause: str, items: list[tuple[RankDoc, list[str], dict[str, Any]]]
                  ) -> Finding:
    ranks = sorted(d.rank for d, _, _ in items)
    ev = [e for _, lines, _ in items for e in lines]
    _, _, x = items[0]
    who = rank_label(ranks)
    med, max_norm, share = x["median_norm"], x["max_norm"], x["share"]
    detail = {**x, "cause": cause, "ranks": ranks}
    if cause == "lr":
        why = (f"each clipped update still moves the weights by {x['update_ratio']:.2g} of "
               "their norm" if x["update_ratio"] is not None and x["update_ratio"] > 0.01
               else f"the gradient norms grew x{x['growth']:.1f}" if (x["growth"] or 0) >= GROWING
               else "the loss does not fall although every update is cut")
        return Finding(
            WARNING, "clipping", f"CLIPPING: {who} {'clips' if len(ranks) == 1 else 'clip'} on "
            f"{share:.0%} of steps (median norm "
            f"{med:.3g}, x{med / max_norm:.0f} max_norm {max_norm:g}) and {why}: the LR is too "
            "high", ev, lr_next(0.1, x["own_lr"]), ranks,
            score=0.7, detail=detail)
    if cause == "max_norm":
        return Finding(
            WARNING, "clipping", f"CLIPPING: {who}: max_norm {max_norm:g} is far below the "
            f"typical pre-clip norm {med:.3g} (x{med / max_norm:.0f}) while the loss falls: "
            f"every update is cut to ~1/{med / max_norm:.0f}; raise max_norm, the LR is not the "
            "problem", ev, f"raise max_norm in the script's clip_grad_norm_ (to about "
            f"{med:.2g}); do not lower the LR", ranks, score=0.7, detail=detail)
    shrink = 1 - max_norm / med if med > max_norm else 0.0
    return Finding(
        INFO, "clipping", f"clipping: {who} {'clips' if len(ranks) == 1 else 'clip'} on "
        f"{share:.0%} of steps at median norm "
        f"{med:.3g} vs max_norm {max_norm:g}: updates shrink by ~{shrink:.0%}"
        + ("; the loss falls: not a problem" if x["falls"] else ""), ev, "", ranks,
        detail=detail)


def legacy_clip(report: Report, rank: int, clipped: int, finite: int, med: float | None,
                 max_norm: float | None) -> None:
    """Clipping judged from the loop row alone (an agent without python.numerics): the norm
    against max_norm; growth cannot be seen there, so the LR is never blamed."""
    if med is None or not max_norm:
        return
    if med > DEFAULTS["clip_far"] * max_norm:
        report.findings.append(Finding(
            WARNING, "clipping", f"CLIPPING: rank {rank}: max_norm {max_norm:g} is far below "
            f"the typical pre-clip norm {med:.3g} (x{med / max_norm:.0f}) on {clipped / finite:.0%}"
            " of steps: raise max_norm, the LR is not the problem",
            [f"rank {rank}: clipped {clipped} of {finite} steps, median norm {med:.3g}"],
            f"raise max_norm in the script's clip_grad_norm_ (to about {med:.2g}); do not "
            "lower the LR", [rank], score=0.7, detail={"cause": "max_norm"}))


def check_lr_zero(report: Report, docs: list[RankDoc]) -> bool:
    """An LR of 0 after the schedule's end is what it is: the job trains on with LR 0."""
    hits = []
    for d in docs:
        rows = _rows(d)
        lrs = _finite([r.get("lr") for r in rows])
        if not lrs or lrs[-1] != 0:
            continue
        # the last step with a known LR above 0 (a row without one, NULL where python.step_stats
        # had no row for the step, is not "above 0": it read "since step 21" for a step-40 end)
        at = next((i for i in range(len(rows) - 1, -1, -1)
                   if (v := num(rows[i].get("lr"))) is not None and v != 0), None)
        since = rows[at]["step"] if at is not None else None
        # the query reads the first 20 steps and the last N: between them nothing was read, so
        # the LR may have reached 0 anywhere in the gap (it said "since step 21" for a step-40
        # end)
        gap = rows[at + 1]["step"] if since is not None and at is not None and \
            at + 1 < len(rows) and rows[at + 1]["step"] > since + 1 else None
        ended = next((int(num(s.get("end_step")) or 0) for s in d.schedule or []
                      if s.get("end_step") is not None), None)
        hits.append((d.rank, since, ended, gap))
    if not hits:
        return False
    _, since, ended, gap = hits[0]

    def when_(since: int | None, gap: int | None) -> str:
        if since is None:
            return "in the whole window"
        if gap is not None:
            return f"since a step between {since + 1} and {gap} (steps in between not read)"
        return f"since step {since + 1}"

    when = when_(since, gap)
    why = (f"the LR schedule ended at its step {ended}" if ended is not None else
           "the schedule (or the loop) set it to 0")
    report.findings.append(Finding(
        WARNING, "lr_zero", f"LR ZERO: {rank_label([h[0] for h in hits])} {when}: {why}; the "
        "steps since change nothing (this is not an LR that is too high)",
        [f"rank {h[0]}: lr 0 {when_(h[1], h[3])}" for h in hits],
        "extend the schedule to the job's real length (its total steps), or stop the job; "
        "probe lr --set LR --force restarts it now", [h[0] for h in hits], score=0.6))
    return True


def _clip_checks(report: Report, ctx: Context) -> None:
    check_clipping(report, ctx.docs)
    check_lr_zero(report, ctx.docs)


#: The checks of this module, for doctor.py's registry: before the LR block (90), which defers
#: to them.
CHECKS = (
    DoctorCheck("clipping", 85, _clip_checks,
                evidence=(Evidence("numerics", "numerics",
                                   lambda last: {"window": max(last, TREND_WINDOW)}),
                          Evidence("schedule", "schedule"))),
)
