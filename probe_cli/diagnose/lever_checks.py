"""`probe doctor`'s checks of host syncs and of mixture-of-experts load. Pure; the summaries are
levers.py's, the thresholds module constants (a healthy loop, and a balanced MoE, stay quiet).

HOST SYNCS (info) names the busiest call sites when a rank makes many syncs per step and the
throughput finding has not already named them as its lever (one problem, one finding).

MOE IMBALANCE names the layer and the expert: a layer whose busiest expert gets at least
``MOE_RATIO`` times its even share (max-to-ideal), or with an expert that got no token in the
window's sampled steps. A dead expert, or a ratio of ``MOE_DEAD_RATIO`` or more, is a warning
(the router collapsed: the experts are not trained, and with expert parallelism the rank holding
the busy one makes the others wait); a milder imbalance is information. With expert
parallelism (the agent read which rank holds each expert: ``owner``, collectives/moe_layout.py)
the title names the rank that holds the busy expert and the share of the layer's tokens it gets
from every rank's router (the tokens it computes), and the evidence adds each rank's time in
all-to-all, saying the peers wait for the holder only when each of them spent longer there than
it did (a small or busy job's expert compute may not show as a wait: seen on lv_moe_ep at load
20, rank 0 holding 98% of the tokens and 1.16 s in all-to-all against rank 1's 0.88 s).
"""

from __future__ import annotations

from typing import Any

from ..group import rank_label
from .checks import Context, DoctorCheck, Evidence
from .findings import INFO, WARNING, Finding, RankDoc, Report, num
from .levers import LEVER_EVIDENCE, syncs_of

MOE_RATIO = 2.0
MOE_DEAD_RATIO = 3.0
#: Sampled steps a layer needs before its load is judged.
MOE_MIN_STEPS = 2


def check_host_syncs(report: Report, docs: list[RankDoc]) -> None:
    got = {d.rank: s for d in docs if (s := syncs_of(d.rows("host_syncs"))) is not None}
    if not got:
        report.unchecked.append("host syncs: no rank answered (an older agent, or no step yet)")
        return
    many = {r: s for r, s in got.items() if s.many}
    if not many:
        worst = max(s.per_step for s in got.values())
        report.fine.append(f"host syncs: at most {worst:g} per step")
        return
    if any(f.check == "throughput" and f.detail.get("lever") == "host_syncs"
           for f in report.findings):
        report.fine.append("host syncs: the throughput finding's lever")
        return
    first = many[min(many)]
    evidence = []
    for r, s in sorted(many.items()):
        evidence.append(f"rank {r}: {s.per_step:g} syncs per step (median of {s.steps} steps), "
                        f"{s.ms_per_step:.2f} ms a step inside them")
        evidence.extend(f"    {site.get('file')}:{site.get('line')} in {site.get('func')}: "
                        f"{num(site.get('calls_per_step')) or 0:g} {site.get('kind')} per step"
                        for site in s.sites if site.get("file"))
    evidence.append(f"each waits for the device on a GPU: {first.advice()}")
    report.findings.append(Finding(
        INFO, "host_syncs", f"HOST SYNCS: {first.top()} ({rank_label(sorted(many))})",
        evidence, "probe query \"SELECT file, line, kind, sum(calls) AS calls FROM "
        "python.host_syncs GROUP BY ALL ORDER BY calls DESC LIMIT 10\"", sorted(many),
        score=max(s.per_step for s in many.values()) / 1e6,
        detail={"lever": "host_syncs", "syncs_per_step": first.per_step}))


def _experts(ids: list[int]) -> str:
    """[1, 2, 3, 5] -> 'experts 1-3, 5'."""
    parts: list[str] = []
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    parts = [f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs]
    word = "expert" if len(ids) == 1 else "experts"
    return f"{word} {', '.join(parts)}"


def moe_layers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One rank's moe_load rows -> per layer: tokens per expert, the busiest, dead ones, the
    max-to-ideal ratio, steps."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(str(r.get("layer")), []).append(r)
    out = []
    for layer, rs in sorted(by.items()):
        tokens = {int(num(r.get("expert")) or 0): int(num(r.get("tokens")) or 0) for r in rs}
        total = sum(tokens.values())
        if not total:
            continue
        busiest = max(tokens, key=lambda e: tokens[e])
        out.append({"layer": layer, "tokens": tokens, "total": total, "busiest": busiest,
                    "busiest_share": tokens[busiest] / total,
                    "dead": [e for e, n in tokens.items() if n == 0],
                    "ratio": tokens[busiest] / (total / len(tokens)),
                    "steps": int(num(rs[0].get("steps")) or 0)})
    return out


def check_moe(report: Report, docs: list[RankDoc]) -> None:
    per = {d.rank: moe_layers(rows) for d in docs if (rows := d.rows("moe"))}
    if not per:
        return  # no MoE router found (most jobs): nothing to say
    bad = []
    for rank, layers in sorted(per.items()):
        for ly in layers:
            if ly["steps"] >= MOE_MIN_STEPS and (ly["dead"] or ly["ratio"] >= MOE_RATIO):
                bad.append((rank, ly))
    if not bad:
        worst = max((ly["ratio"] for layers in per.values() for ly in layers), default=1.0)
        report.fine.append(f"MoE load: every layer within {worst:.1f}x of an even share")
        return
    rank, ly = max(bad, key=lambda x: (len(x[1]["dead"]), x[1]["ratio"]))
    dead = f", {_experts(ly['dead'])} none" if ly["dead"] else ""
    title = (f"MOE IMBALANCE: {ly['layer']}: expert {ly['busiest']} gets "
             f"{ly['busiest_share']:.0%} of tokens{dead} (max-to-ideal {ly['ratio']:.1f}x)")
    ep = expert_ranks(docs, ly["layer"])
    holder = ep["owners"].get(ly["busiest"]) if ep else None
    if ep and holder is not None:
        title += (f"; rank {holder} holds it and computes {ep['share'][holder]:.0%} of the "
                  f"layer's tokens (an even share is {1 / len(ep['share']):.0%})")
    evidence = []
    for r, x in bad[:8]:
        evidence.append(f"rank {r}: {x['layer']}: tokens per expert over {x['steps']} sampled "
                        f"steps {[x['tokens'][e] for e in sorted(x['tokens'])]}, max-to-ideal "
                        f"{x['ratio']:.1f}x" + (f", {_experts(x['dead'])} got none"
                                                 if x["dead"] else ""))
    if ep:
        evidence.extend(ep["lines"])
    evidence.extend(_all_to_all(docs, holder))
    evidence.append("the router sends most tokens to few experts: a load-balancing loss "
                    "(router_aux_loss_coef), router z-loss, capacity limits, or a higher "
                    "router learning-rate warm-up")
    severe = any(x["dead"] or x["ratio"] >= MOE_DEAD_RATIO for _, x in bad)
    report.findings.append(Finding(
        WARNING if severe else INFO, "moe", title, evidence,
        "probe query \"SELECT layer, expert, sum(tokens) AS tokens FROM python.moe_load "
        "GROUP BY ALL ORDER BY layer, expert\"",
        sorted({r for r, _ in bad} | ({holder} if holder is not None else set())),
        score=ly["ratio"] / 10, detail={"layer": ly["layer"], "expert": ly["busiest"],
                                        "ratio": ly["ratio"], "dead": ly["dead"],
                                        "holder": holder}))


def expert_ranks(docs: list[RankDoc], layer: str) -> dict[str, Any] | None:
    """With expert parallelism, where ``layer``'s tokens are computed: the rank holding each
    expert (``owners``), the share of the tokens of every rank's router that each holder gets
    (``share``) and evidence lines; None when the layer's experts are not spread over ranks (or
    the agent is too old to say)."""
    owners: dict[int, int] = {}
    tokens: dict[int, int] = {}
    for d in docs:
        for r in d.rows("moe") or []:
            if str(r.get("layer")) != layer or (o := num(r.get("owner"))) is None:
                continue
            e = int(num(r.get("expert")) or 0)
            owners[e] = int(o)
            tokens[int(o)] = tokens.get(int(o), 0) + int(num(r.get("tokens")) or 0)
    total = sum(tokens.values())
    if len(set(owners.values())) < 2 or not total:
        return None
    share = {r: tokens.get(r, 0) / total for r in sorted(set(owners.values()))}
    lines = [f"expert parallelism ({layer}): rank {r} holds "
             f"{_experts([e for e, o in owners.items() if o == r])} and computes "
             f"{tokens.get(r, 0)} of the {total} tokens every rank's router sent ({share[r]:.0%})"
             for r in share]
    return {"owners": owners, "share": share, "lines": lines}


def _all_to_all(docs: list[RankDoc], holder: int | None = None) -> list[str]:
    """Each rank's time in all-to-all collectives (expert parallelism), when any. The wait is
    said to be for the holder only when every other rank spent longer in them than it did (on
    a small or busy job the busy expert's compute may not show as a wait at all)."""
    got = {}
    for d in docs:
        a2a = [c for c in d.collectives if "all_to_all" in str(c.get("op", ""))]
        if a2a:
            got[d.rank] = (len(a2a), sum(num(c.get("duration")) or 0.0 for c in a2a))
    waits = holder is not None and holder in got and len(got) > 1 and all(
        s > got[holder][1] for r, (_, s) in got.items() if r != holder)
    out = []
    for r, (n, secs) in got.items():
        why = ("the rank holding the busy expert makes its peers wait here" if holder is None
               else "" if not waits
               else "it holds the busy expert: its peers wait for it here" if r == holder
               else f"its wait here is for rank {holder}, which holds the busy expert")
        out.append(f"rank {r}: {n} all-to-all calls, {secs:.3f} s in them"
                   + (f" ({why})" if why else ""))
    if holder is not None and got and not waits:
        out.append(f"the all-to-all times do not show rank {holder}'s peers waiting for it in "
                   "this window (its extra expert compute is small beside the step)")
    return out


def _host_syncs(report: Report, ctx: Context) -> None:
    if not ctx.verdict.problem:  # after throughput (110): it defers to its host_syncs lever
        check_host_syncs(report, ctx.docs)


#: The checks of this module, for doctor.py's registry (checks.py).
CHECKS = (
    DoctorCheck("host_syncs", 112, _host_syncs, evidence=LEVER_EVIDENCE[:1]),
    DoctorCheck("moe", 115, lambda report, ctx: check_moe(report, ctx.docs),
                evidence=(Evidence("moe", "moe_load", lambda last: {"last": last}),)),
)
