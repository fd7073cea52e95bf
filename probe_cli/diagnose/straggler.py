"""The straggler verdict: pure functions from every rank's collectives (and, when recorded, its
step times) to "rank N is slow, by this much". No I/O here; ``probe straggler`` gathers.

Why arrivals, not step times
----------------------------
In a synchronous job every rank's step takes as long as the slowest rank's: the others wait for
it inside a collective. So per-rank step time cannot name the straggler. What differs is *when
each rank enters* the collectives: the Flight Recorder numbers them identically on every rank of
a group, so for each (group, seq) the rank that arrives last is the one the others waited for,
and its lag behind the median arrival is the time it cost them. Summed over a window, that lag
is how much slower the straggler is; divided by the window, the share of the job's time lost.
Arrival times come from each rank's own clock: ranks on different hosts carry their clock skew
(NTP: usually well under a millisecond, so small next to a straggler worth naming).

Only on evidence
----------------
On a busy node every rank is last now and then. A rank is named only when (1) it is last far
more often than chance: a one-sided binomial test of its count of last arrivals against
1/world_size, Bonferroni-corrected over the ranks, below ``ALPHA``, with at least
``MIN_SAMPLES`` samples, counted once a step (``step_blocks``: the collectives of one step
are late together); and (2) what it costs is a real share of the time: the others' wait for
it beyond any other rank's is at least ``min_share`` of the window. (Measured false alarm
before: rank 0 last at 80 of 157 collectives vs 62, p = 0.07, named anyway.)

JSON (``StragglerVerdict.to_json``, stable): ``problem``, ``headline``, ``details``,
``culprits``, then ``window_s``, ``collectives``, ``p_value`` (of the named or most-often-last
rank, null without a test), ``cpu_contention`` (true: a rank would have been named, but every
rank waits for a CPU alike, or the ranks share cores: cpu_wait.py), ``shared_cpus`` (those
cores, ``"0-1"``, else ""), ``ranks``: [{rank, arrived_last, others_waited_s, median_lag_ms,
cpu_wait_share, cpu_run_share, cpus, load_1m}] (the last four null when not recorded).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from probe_protocol.cpulist import cpu_list

from ..group import rank_label
from .cpu_wait import RankCpu, cpu_contention, load_note
from .rank_work import why_slower
from .rhythm import normal_wait
from .verdict import Verdict


@dataclass(slots=True)
class Lateness:
    rank: int
    last: int = 0
    """Collectives at which this rank arrived last (by more than ``MIN_LAG_S``)."""
    caused_s: float = 0.0
    """Sum over those of its lag behind the median arrival: the others' wait for it."""
    lags: list[float] = field(default_factory=list)


@dataclass(slots=True)
class StragglerVerdict(Verdict):
    window_s: float = 0.0
    collectives: int = 0
    per_rank: dict[int, Lateness] = field(default_factory=dict)
    p_value: float | None = None
    contention: bool = False
    """A rank would have been named, but waiting for a CPU explains its lateness: every rank
    waits alike, or the ranks share cores and the scheduler picks which one waits."""
    shared_cpus: str = ""
    """The CPUs the ranks share when that is why none is named (``0-1``)."""
    cpu: dict[int, RankCpu] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            **Verdict.to_json(self), "window_s": round(self.window_s, 4),
            "collectives": self.collectives,
            "p_value": None if self.p_value is None else float(f"{self.p_value:.3g}"),
            "cpu_contention": self.contention, "shared_cpus": self.shared_cpus,
            "ranks": [{"rank": r.rank, "arrived_last": r.last,
                       "others_waited_s": round(r.caused_s, 4),
                       "median_lag_ms": round(statistics.median(r.lags) * 1e3, 3) if r.lags
                       else None, **self._cpu_json(r.rank)}
                      for r in sorted(self.per_rank.values(), key=lambda x: x.rank)],
        }

    def _cpu_json(self, rank: int) -> dict[str, Any]:
        c = self.cpu.get(rank)
        return {"cpu_wait_share": c.wait if c else None,
                "cpu_run_share": c.run if c else None,
                "cpus": cpu_list(c.cpus) if c and c.cpus else None,
                "load_1m": c.load if c else None}


#: A rank arriving last by less than this is noise (thread wake-ups), not a straggler.
MIN_LAG_S = 0.001
#: Family-wise false-alarm rate of "last more often than chance" (one test per rank).
ALPHA = 1e-3
#: Fewer collectives than this with a clear last rank: no verdict, however lopsided.
MIN_SAMPLES = 20


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed exactly in log space (n is a few hundred)."""
    if k <= 0:
        return 1.0
    total = 0.0
    for i in range(k, n + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                          + i * math.log(p) + (n - i) * math.log1p(-p))
    return min(1.0, total)


def step_blocks(window: list[dict[int, float]]) -> list[int]:
    """A block number per collective of ``window`` (time order): collectives that follow each
    other within a step share one. The collectives of one step are not independent samples:
    DDP's buckets (and each micro-batch's) follow each other within milliseconds, so a rank
    delayed once is last at all of them. Blocks start at the long gaps when the gaps are
    clearly of two kinds (the 90th percentile over 8x the 25th); otherwise every collective is
    its own block. Measured before: a healthy job on 2 busy cores, 6 collectives a step, rank 0
    last at 72 of 110, p = 0.0015 counted one per collective, and once named."""
    starts = [statistics.median(t.values()) for t in window]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    if len(gaps) < 4:
        return list(range(len(window)))
    q = statistics.quantiles(gaps, n=20)
    lo, hi = max(q[4], 1e-4), q[17]  # 25th and 90th percentiles
    if hi < 8 * lo:
        return list(range(len(window)))
    cut = math.sqrt(lo * hi)
    blocks, b = [0], 0
    for g in gaps:
        b += g > cut
        blocks.append(b)
    return blocks


def arrivals(rows_by_rank: dict[int, list[dict[str, Any]]],
             last: int) -> list[dict[int, float]]:
    """The last ``last`` collectives every member answered for: rank -> entry time, by seq."""
    table: dict[tuple[str, int], dict[int, float]] = {}
    members: dict[tuple[str, int], tuple[int, ...]] = {}
    for rank, rows in rows_by_rank.items():
        for r in rows:
            if r.get("is_p2p") or r.get("seq") is None or r.get("start_time") is None:
                continue
            key = (str(r.get("pg")), int(r["seq"]))
            table.setdefault(key, {})[rank] = float(r["start_time"])
            members[key] = tuple(r.get("group_ranks") or sorted(rows_by_rank))
    answered = set(rows_by_rank)
    complete = [(key, times) for key, times in table.items()
                if len(times) > 1 and set(members[key]) & answered <= set(times)]
    complete.sort(key=lambda kv: statistics.median(kv[1].values()))
    return [times for _, times in complete[-last:]]


def hung_now(rows_by_rank: dict[int, list[dict[str, Any]]],
             now_by_rank: dict[int, float]) -> str | None:
    """Why no straggler may be named now: a collective has been pending on some rank for as
    long as the hang verdict calls stuck (the job's own rhythm, rhythm.py). Arrivals from before
    a hang describe the past, and the rank that hangs is often not the one that was late (a
    rank hung in a sleep was named "9.2 ms slower" from the collectives before)."""
    from .hang import RankState, oldest_pending

    states = [RankState(r, collectives=tuple(rows), now=now_by_rank[r])
              for r, rows in rows_by_rank.items() if now_by_rank.get(r)]
    rule = normal_wait(states)
    waits = [(s.rank, w, s.now) for s in states if (w := oldest_pending(s, rule.wait_s))]
    if not waits:
        return None
    r, w, now = max(waits, key=lambda x: x[2] - float(x[1].get("start_time") or x[2]))
    return (f"rank {r} has waited {now - float(w.get('start_time') or now):.1f} s in "
            f"{w.get('op')} #{w.get('seq')} (stuck beyond {rule.wait_s:.1f} s): the job looks "
            "hung, so arrivals say nothing about a straggler; run probe hang")


def diagnose_stragglers(rows_by_rank: dict[int, list[dict[str, Any]]], *, last: int = 200,
                        min_share: float = 0.05, step_s: float | None = None,
                        now_by_rank: dict[int, float] | None = None,
                        cpu_wait: dict[int, float | RankCpu] | None = None,
                        work: dict[int, dict[str, Any]] | None = None) -> StragglerVerdict:
    """Name the rank the others wait for, if it costs them at least ``min_share`` of the time.

    ``step_s``: the ranks' median step time, when known: the window then counts as no more
    independent samples than the steps it spans (the collectives of one step are late
    together, however they are spaced: 2 micro-batches' all-reduces 10 ms apart in a 60 ms
    step do not form separate groups of gaps).
    ``cpu_wait``: each rank's share of step time its training thread waited for a CPU (Linux
    run queue), when recorded, or its ``RankCpu`` (also its time on a CPU and where it ran):
    see ``cpu_wait.cpu_contention``.
    ``work``: each rank's rank_work row (samples, tokens, context, DataLoader wait, host syncs
    per step): a named straggler's headline then says why it is slower (rank_work.py)."""
    window = arrivals(rows_by_rank, last)
    per_rank = {r: Lateness(r) for r in sorted(rows_by_rank)}
    hung = hung_now(rows_by_rank, now_by_rank) if now_by_rank else None
    if hung:
        return StragglerVerdict(False, f"no straggler verdict: {hung}", per_rank=per_rank)
    if len(window) < 2:
        return StragglerVerdict(False, "no verdict: fewer than 2 collectives seen on every rank "
                                "(is the job running collectives? is it a single rank?)",
                                per_rank=per_rank)
    lasts: dict[int, list[int]] = {}  # step block -> the last rank of its decided collectives
    for block, times in zip(step_blocks(window), window):
        late_rank = max(times, key=lambda r: times[r])
        others = [t for r, t in times.items() if r != late_rank]
        lag = times[late_rank] - statistics.median(others)
        if lag > MIN_LAG_S:
            lasts.setdefault(block, []).append(late_rank)
            entry = per_rank[late_rank]
            entry.last += 1
            entry.caused_s += lag
            entry.lags.append(lag)
    span = max(max(t.values()) for t in window) - min(min(t.values()) for t in window)
    worst = max(per_rank.values(), key=lambda e: e.caused_s)
    share = worst.caused_s / span if span > 0 else 0.0
    # Only a rank that is late *more than the others* is a straggler: in a healthy job on busy
    # cores every rank is last now and then, and each one's waits add up to a few percent.
    runner_up = max((e.caused_s for e in per_rank.values() if e is not worst), default=0.0)
    excess = (worst.caused_s - runner_up) / span if span > 0 else 0.0
    v = StragglerVerdict(False, "", window_s=span, collectives=len(window), per_rank=per_rank)
    world = max(len(t) for t in window)
    decided = sum(e.last for e in per_rank.values())
    often = max(per_rank.values(), key=lambda e: e.last)
    # One sample per step block: the rank last at most of its collectives.
    block_last = [max(set(rs), key=rs.count) for rs in lasts.values()]
    n_eff, k_eff = len(block_last), block_last.count(often.rank)
    steps = round(span / step_s) if step_s and step_s > 0 else None
    if steps is not None and 0 < steps < n_eff:  # fewer steps than samples: scale down
        n_eff, k_eff = steps, round(k_eff * steps / n_eff)
    p = min(1.0, world * binomial_tail(k_eff, n_eff, 1.0 / world)) if n_eff else 1.0
    v.p_value = p
    evidence = n_eff >= MIN_SAMPLES and p < ALPHA and often.rank == worst.rank
    for e in sorted(per_rank.values(), key=lambda e: -e.caused_s):
        if e.lags:
            v.details.append(
                f"rank {e.rank}: last to arrive at {e.last} of {len(window)} collectives, "
                f"a median {statistics.median(e.lags) * 1e3:.1f} ms after the others; they "
                f"waited {e.caused_s:.2f} s for it")
    n_note = (f"; last at {k_eff} of {n_eff} steps, counted once a step: the collectives of "
              "one step are late together" if n_eff < decided else "")
    v.details.append(f"chance: the most often last rank ({often.rank}, {often.last} of {decided}"
                     f"{n_note}) against 1/{world} each: p = {p:.2g} (named only below "
                     f"{ALPHA:g}, "
                     f"with {MIN_SAMPLES}+ collectives); its excess wait "
                     f"{excess:.1%} of the window (named from {min_share:.0%})")
    cpu = {r: w if isinstance(w, RankCpu) else RankCpu(float(w))
           for r, w in (cpu_wait or {}).items()}
    waits = {r: c.wait for r, c in cpu.items()}
    v.cpu = cpu
    contention = cpu_contention(worst.rank, excess, cpu)
    if contention is not None:
        v.details.append(contention.line)
    if evidence and excess >= min_share and worst.lags and contention is not None \
            and contention.kind == "shared":
        v.contention = True
        v.shared_cpus = contention.cpus
        base = statistics.median(w for r, w in waits.items() if r != worst.rank)
        v.headline = (f"no straggler: rank {worst.rank} waited for a CPU "
                      f"{waits[worst.rank]:.0%} of its step time (the others a median "
                      f"{base:.0%}), but {rank_label(cpu)} share CPUs {contention.cpus} "
                      f"of one machine{load_note(cpu[worst.rank])} with no pinning: which of "
                      "them waits is the scheduler's pick, not the rank's doing; the machine is "
                      "oversubscribed")
    elif evidence and excess >= min_share and worst.lags and contention is not None \
            and contention.kind == "scheduler":
        v.contention = True
        v.headline = (f"no straggler: the ranks wait for a CPU "
                      f"{min(waits.values()):.0%}-{max(waits.values()):.0%} of their step "
                      f"time, and the rank that arrives last follows the scheduler (rank "
                      f"{worst.rank} now): the host is oversubscribed")
    elif evidence and excess >= min_share and worst.lags:
        lag_ms = statistics.median(worst.lags) * 1e3
        v.problem = True
        v.culprits = [worst.rank]
        v.headline = (f"STRAGGLER: rank {worst.rank} is {lag_ms:.1f} ms slower than the median "
                      f"rank each time it is last; the others waited for it {share:.0%} of the "
                      f"last {span:.1f} s ({len(window)} collectives)")
        if contention is not None and contention.kind == "own":
            v.headline += (f"; it waited for a CPU {waits[worst.rank]:.0%} of its step time: "
                           "another process or too many threads on its cores")
        elif contention is not None and contention.kind == "compute":
            v.headline += (f"; it ran on a CPU {cpu[worst.rank].run or 0:.0%} of its step time, "
                           "more than the others: it computes more")
        reasons = why_slower(worst.rank, work or {})
        if reasons:
            v.headline += f"; why: {reasons[0]}"
            v.details.extend(f"rank {worst.rank}: {w}" for w in reasons)
    else:
        why = (f"no rank is last more often than chance (p = {p:.2g})" if not evidence else
               f"no rank cost the others {min_share:.0%} more than any other rank did")
        if n_eff < MIN_SAMPLES:
            why = (f"too few collectives with a clear last rank ({decided} < {MIN_SAMPLES})"
                   if n_eff == decided else f"too few steps with a clear last rank ({n_eff} < "
                   f"{MIN_SAMPLES}, from {decided} collectives)")
        v.headline = (f"no straggler: {why} in the last {span:.1f} s ({len(window)} "
                      f"collectives on {rank_label(per_rank)})")
    return v
