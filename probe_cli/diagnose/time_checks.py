"""`probe doctor`'s checks of where the time goes: a hang, a stalled rank, a straggler, waiting
in collectives and in the DataLoader, and the slowest modules. Each check looks at one thing a
user would otherwise have to know to ask about, and adds ``Finding``s to the report, or a
one-line ``fine`` note (checked, nothing wrong), or says why it could not check
(``unchecked``: the table is not recorded, the rank did not answer). Pure; no I/O.

Thresholds are module constants, chosen so a healthy toy job on 2 busy cores stays quiet.
"""

from __future__ import annotations

import importlib.util
import statistics
from typing import Any

from ..group import rank_label
from .checks import Context, DoctorCheck, Evidence
from .cpu_wait import RankCpu
from .findings import CRITICAL, INFO, WARNING, Finding, RankDoc, Report, first_loop, num, unrecorded
from .hang import HangVerdict, where
from .rank_work import held_tokens
from .straggler import arrivals, diagnose_stragglers

#: DataLoader wait above this share of step time is a finding.
DATA_WAIT_SHARE = 0.3
#: Time inside explicit collectives above this share of wall time is a finding.
COLLECTIVE_SHARE = 0.3
#: A rank with no optimizer step for max(STALL_STEPS × its median step, min_wait) is stalled.
STALL_STEPS = 20
#: A straggler the others wait for at least this share of the time (`probe straggler`: 5%).
STRAGGLER_SHARE = 0.2
#: Slowest modules asked of each rank (slow_modules' limit) and shown.
TOP_MODULES = 5


def busy_not_stuck(verdict: HangVerdict, docs: list[RankDoc], min_wait: float) -> HangVerdict:
    """The hang verdict, unless it blames only ranks whose collectives read timed out (a held
    GIL, or a busy node) and every one of them then answered doctor's own round with a step
    finished recently: a rank whose Python does not run can do neither. On a busy node
    "STUCK: ranks 0,1 do not run Python" was printed while the steps kept advancing."""
    suspects = set(verdict.gil_suspects)
    if not blames_only_gil(verdict):
        return verdict
    by_rank = {d.rank: d for d in docs}
    lines = []
    for r in sorted(suspects):
        d = by_rank.get(r)
        state = (d.state if d is not None else None) or {}
        clock, now = state.get("clock") or {}, num(state.get("now"))
        last = num(clock.get("last_step_at"))
        step_ms = num(first_loop(d).get("step_ms")) or 0.0 if d is not None else 0.0
        if now is None or last is None or now - last >= max(min_wait, STALL_STEPS * step_ms / 1e3):
            return verdict
        lines.append(f"rank {r}: at step {clock.get('step')}, its last step finished "
                     f"{now - last:.1f} s before it answered")
    ranks = rank_label(sorted(suspects))
    return HangVerdict(
        False, f"no hang: {ranks} answered the collectives read too late, then kept stepping "
        "(a busy node, not a held GIL)",
        [*lines, f"the first read said: {verdict.headline}"], confidence="medium",
        basis="the ranks blamed for not running Python finished optimizer steps since",
        threshold_s=verdict.threshold_s)


def blames_only_gil(verdict: HangVerdict) -> bool:
    """The verdict is a hang that rests only on ranks whose collectives read timed out."""
    suspects = set(verdict.gil_suspects)
    return bool(verdict.problem and suspects and suspects >= set(verdict.culprits))


def kept_stepping(verdict: HangVerdict, before: dict[int, int | None],
                  after: dict[int, int | None]) -> HangVerdict | None:
    """A "STUCK: ranks do not run Python" verdict read again: when every suspect's heartbeat
    step (``before``: the first read, ``after``: a later one; read from outside the process)
    moved on, its Python ran and finished optimizer steps in between: a busy node, not a held
    GIL. None when some suspect did not move (or the verdict is another). On a node with a
    load of 25 on 2 cores every real script read "[critical] STUCK" while stepping, and the
    ranks were too slow to answer doctor's second round too (busy_not_stuck had no clock)."""
    if not blames_only_gil(verdict):
        return None
    moved = []
    for r in sorted(set(verdict.gil_suspects)):
        a, b = before.get(r), after.get(r)
        if a is None or b is None or b <= a:
            return None
        moved.append(f"rank {r}: step {a} -> {b} between two reads from outside the process")
    ranks = rank_label(sorted(set(verdict.gil_suspects)))
    return HangVerdict(
        False, f"no hang: {ranks} kept stepping while too slow to answer (a busy node, not a "
        "held GIL)", [*moved, f"the first read said: {verdict.headline}"], confidence="medium",
        basis="the ranks blamed for not running Python finished optimizer steps since",
        threshold_s=verdict.threshold_s)


def _union(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``intervals`` (start, end)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def check_hang(report: Report, verdict: HangVerdict) -> None:
    if verdict.problem:
        report.findings.append(Finding(
            CRITICAL, "hang", verdict.headline, list(verdict.details), "probe hang",
            list(verdict.culprits), score=1e9))
    else:
        report.fine.append(f"hang: {verdict.headline}")


def check_stalls(report: Report, docs: list[RankDoc], min_wait: float) -> None:
    """A rank that stopped stepping without waiting in a collective (a stuck DataLoader, a
    deadlock in host code, a single-process job)."""
    stalled = []
    for d in docs:
        clock, now = (d.state or {}).get("clock") or {}, num((d.state or {}).get("now"))
        last = num(clock.get("last_step_at"))
        if last is None or now is None:
            continue
        step_ms = num(first_loop(d).get("step_ms")) or 0.0
        idle = now - last
        if idle >= max(min_wait, STALL_STEPS * step_ms / 1e3):
            stalled.append((d, idle, step_ms))
    if not stalled:
        if any((d.state or {}).get("clock", {}).get("last_step_at") for d in docs):
            report.fine.append("progress: every rank finished an optimizer step recently")
        return
    evidence = []
    for d, idle, step_ms in stalled:
        usual = f" (its steps took {step_ms:.1f} ms)" if step_ms else ""
        step = (d.state or {}).get("clock", {}).get("step")
        evidence.append(f"rank {d.rank}: no optimizer step for {idle:.1f} s since step {step}"
                        f"{usual}")
        waiting = num(((d.state or {}).get("loop") or {}).get("data_waiting_s"))
        place, frames = where(d.frames, children=d.children)
        if waiting is not None:
            evidence.append(f"rank {d.rank}: waiting for a batch in DataLoader __next__ for "
                            f"{waiting:.1f} s")
        evidence.append(f"rank {d.rank}: main thread is {place}")
        evidence.extend(f"    {f}" for f in frames)
    ranks = [d.rank for d, _, _ in stalled]
    in_dl = all(num(((d.state or {}).get("loop") or {}).get("data_waiting_s")) is not None
                for d, _, _ in stalled)
    one = len(ranks) == 1
    what = ("waits" if one else "wait") + " for the DataLoader" if in_dl else \
        ("makes" if one else "make") + " no progress"
    report.findings.append(Finding(
        CRITICAL, "stall",
        f"STALLED: {rank_label(ranks)} {what}: no optimizer step for "
        f"{max(i for _, i, _ in stalled):.1f} s",
        evidence, "probe backtrace --children" if in_dl else "probe backtrace", ranks,
        score=1e8))


def check_straggler(report: Report, docs: list[RankDoc]) -> None:
    rows = {d.rank: list(d.collectives) for d in docs if d.collectives}
    if len(rows) < 2:
        report.unchecked.append("straggler: needs collectives from 2 or more ranks")
        return
    step_ms = [num(first_loop(d).get("step_ms")) for d in docs]
    known = [x for x in step_ms if x is not None and x > 0]
    cpu: dict[int, float | RankCpu] = {  # over the collectives' window, else the loop's
        d.rank: c for d in docs
        if (c := RankCpu.from_row((d.rows("cpu") or [first_loop(d)])[0])) is not None}
    work = {d.rank: w[0] for d in docs if (w := d.rows("work"))}
    for r, tokens in held_tokens([x for d in docs for x in d.rows("moe") or []]).items():
        work[r] = {**work.get(r, {}), "moe_tokens": tokens}  # the MoE check's evidence
    v = diagnose_stragglers(rows, last=len(next(iter(rows.values()))),
                            min_share=STRAGGLER_SHARE,
                            step_s=statistics.median(known) / 1e3 if known else None,
                            cpu_wait=cpu,
                            work=work)
    if v.contention:  # time lost, but to the host: information, with where to look
        report.findings.append(Finding(
            INFO, "cpu_contention", f"CPU CONTENTION: {v.headline.removeprefix('no straggler: ')}",
            list(v.details), "top -H (what else runs on the node; threads per rank: "
            "OMP_NUM_THREADS, DataLoader workers)" + (
                f"; or give each rank CPUs of its own out of {v.shared_cpus} (taskset -c)"
                if v.shared_cpus else ""), [], score=0.0))
    elif v.problem:
        share = max(e.caused_s for e in v.per_rank.values()) / v.window_s if v.window_s else 0
        report.findings.append(Finding(WARNING, "straggler", v.headline, list(v.details),
                                       "probe straggler", list(v.culprits), score=share))
    else:
        report.fine.append(f"straggler: {v.headline}")


def check_collective_wait(report: Report, docs: list[RankDoc]) -> None:
    """Share of wall time each rank spent in collectives waiting for its peers to arrive.

    For every collective all members answered for (same group and seq; DDP's own all-reduces
    included, from the Flight Recorder), a rank that entered at t_r cannot leave before the last
    member entered at t_max: it waited at least t_max - t_r. Summed over the window and divided
    by the window's span, that is a lower bound of the time lost to waiting (gloo records no
    end times, so the transfer itself is not counted).
    """
    rows = {d.rank: list(d.collectives) for d in docs if d.collectives}
    window = arrivals(rows, max((len(r) for r in rows.values()), default=0))
    if len(rows) < 2 or len(window) < 2:
        report.unchecked.append("collective wait: needs collectives from 2 or more ranks")
        return
    span = max(max(t.values()) for t in window) - min(min(t.values()) for t in window)
    # A rank's waits are intervals [entered, last member entered]; collectives in flight at
    # once (DDP's bucketed async all-reduces) overlap, and summed they counted the same time
    # twice ("105% of the time waiting"): the union of the intervals is what was lost.
    spans: dict[int, list[tuple[float, float]]] = {r: [] for r in rows}
    for times in window:
        last = max(times.values())
        for r, t in times.items():
            spans[r].append((t, last))
    waited = {r: _union(iv) for r, iv in spans.items()}
    shares = {r: w / span for r, w in waited.items()} if span > 0 else {}
    high = {r: s for r, s in shares.items() if s >= COLLECTIVE_SHARE}
    summary = ", ".join(f"rank {r} {s:.0%}" for r, s in sorted(shares.items()))
    if not high:
        report.fine.append(f"collective wait: {summary} of the last {span:.1f} s waiting for "
                           "peers")
        return
    evidence = [f"rank {r}: waited for its peers {s:.0%} of the last {span:.1f} s "
                f"({waited[r]:.2f} s over {len(window)} collectives)"
                for r, s in sorted(shares.items())]
    top = max(high.values())
    verb = "spends" if len(high) == 1 else "spend"
    # The waiting ranks are the victims: when a straggler was named, it is the cause and
    # leads (culprit first); this finding then says whom they wait for. With no straggler the
    # ranks wait for each other by turns (jitter, a busy node): time lost, but no rank to blame
    # and nothing wrong with the job, so it is said without a warning (no false alarm).
    named = [f for f in report.findings if f.check == "straggler"]
    if not named:
        report.findings.append(Finding(
            INFO, "collectives",
            f"collective wait: {rank_label(sorted(high))} {verb} {top:.0%} of the time waiting "
            "for peers, with no straggler to blame (step-time jitter, a busy node, or too "
            "few steps yet to name one)", evidence, "probe straggler", sorted(high), score=top))
        return
    report.findings.append(Finding(
        WARNING, "collectives",
        f"COLLECTIVE WAIT: {rank_label(sorted(high))} {verb} {top:.0%} of the time waiting in "
        f"collectives for their peers ({rank_label(named[0].ranks)}, the straggler above)",
        evidence, "probe straggler", sorted(high),
        score=min(top, min(f.score for f in named) - 1e-6)))


def check_data_wait(report: Report, docs: list[RankDoc]) -> None:
    got = {d.rank: first_loop(d) for d in docs if d.loop and num(first_loop(d).get("steps"))}
    if not got:
        # the ranks did not answer the loop query (a timeout on a busy node): nothing is known
        errs = sorted({d.errors["loop"] for d in docs if d.loop is None and d.errors.get("loop")})
        why = f"not read ({errs[0]})" if errs else "no steps in python.step_stats yet"
        report.unchecked.append(f"DataLoader wait: {why}")
        return
    shares = {r: (num(x.get("data_wait_share")) or 0.0, x) for r, x in got.items()}
    high = {r: s for r, s in shares.items() if s[0] >= DATA_WAIT_SHARE}
    if not high:
        worst = max(s[0] for s in shares.values())
        report.fine.append(f"DataLoader wait: at most {worst:.0%} of step time")
        return
    evidence = [f"rank {r}: {s:.0%} of step time in DataLoader __next__ (median "
                f"{num(x.get('data_wait_ms')) or 0:.1f} ms of {num(x.get('step_ms')) or 0:.1f} "
                f"ms steps, last {x.get('steps')} steps)" for r, (s, x) in sorted(high.items())]
    evidence.append("the model waits for input: more DataLoader workers, pin_memory, "
                    "prefetching, or cheaper per-sample work")
    top = max(s[0] for s in high.values())
    report.findings.append(Finding(
        WARNING, "dataloader",
        f"DATA-BOUND: {rank_label(sorted(high))} {'waits' if len(high) == 1 else 'wait'} for "
        f"the DataLoader {top:.0%} of each step",
        evidence,
        'probe query "SELECT step, round(data_wait * 1e3, 1) AS data_wait_ms, batches '
        'FROM python.step_stats ORDER BY step DESC LIMIT 10"', sorted(high), score=top))


def check_modules(report: Report, docs: list[RankDoc]) -> None:
    """The slowest modules by self time, from slow_modules: the numbers `probe slow` shows
    (each call's time minus its nested calls', median per call x median calls per step), so
    the module named first is the one `probe slow` ranks first. A wrapper (DDP around the
    model) costs only its own work and needs no special case. Across ranks, a module's figure
    is its mean over the ranks that answered (0 where it is not in a rank's top list)."""
    per: dict[str, list[dict[str, Any]]] = {}
    answered = sum(1 for d in docs if d.slow)
    for d in docs:
        for row in d.slow or []:
            per.setdefault(str(row.get("module")), []).append(row)
    if not per:
        why = ("no traced steps yet (PROBE_TRACE=every:N; `probe trace on`)"
               if any(d.slow is not None for d in docs) else unrecorded(docs, "slow"))
        report.unchecked.append(f"slowest modules: {why}")
        return

    def avg(rows: list[dict[str, Any]], key: str) -> float:
        return sum(num(r.get(key)) or 0.0 for r in rows) / max(answered, len(rows))

    top = sorted(per.items(), key=lambda kv: -avg(kv[1], "self_ms"))[:3]
    evidence = [f"{name}: {avg(rows, 'self_ms'):.1f} ms per step of its own "
                f"(forward {avg(rows, 'fwd_self_ms'):.1f}, backward "
                f"{avg(rows, 'bwd_self_ms'):.1f}), {avg(rows, 'pct'):.0f}% of the traced time"
                for name, rows in top]
    name = top[0][0]
    nxt = "probe slow" if importlib.util.find_spec("probe_cli.commands.slow") else \
        'probe query "SELECT module, stage, median(duration) FROM python.torch_trace GROUP BY ALL' \
        ' ORDER BY 3 DESC LIMIT 10"'
    # Always info: per-module times are attributions (backward spans include the autograd work
    # between modules), so "slowest" is where to look first, not a verdict.
    report.findings.append(Finding(INFO, "modules", f"slowest modules: {name} first", evidence,
                                   nxt))


def _stalls(report: Report, ctx: Context) -> None:
    if not ctx.verdict.problem:  # a hung job's ranks are all "stalled"; the hang says it
        check_stalls(report, ctx.docs, ctx.min_wait)


def _straggler_and_wait(report: Report, ctx: Context) -> None:
    if ctx.verdict.problem:  # timings from before a hang describe the past, and would distract
        # a failed collective or a dead rank is not a hang (a post-mortem of a SIGKILLed rank
        # said "the job is hung")
        what = ("a collective failed or a rank is gone" if ctx.verdict.headline.startswith(
            "PROBLEM") else "the job is hung")
        report.unchecked.append(f"straggler, collective wait: {what} (see above)")
        return
    check_straggler(report, ctx.docs)
    check_collective_wait(report, ctx.docs)


def _data_wait(report: Report, ctx: Context) -> None:
    if any(f.check == "stall" for f in report.findings):
        report.unchecked.append("DataLoader wait share: a rank is stalled (see above)")
    else:
        check_data_wait(report, ctx.docs)


_LOOP = Evidence("loop", "doctor_loop", lambda last: {"last": last})

#: The checks of this module, for doctor.py's registry (checks.py).
CHECKS = (
    DoctorCheck("hang", 10, lambda report, ctx: check_hang(report, ctx.verdict)),
    DoctorCheck("stall", 20, _stalls, evidence=(_LOOP,)),
    DoctorCheck("straggler", 60, _straggler_and_wait, evidence=(
        _LOOP, Evidence("work", "rank_work", lambda last: {"last": last}))),
    DoctorCheck("data_wait", 80, _data_wait, evidence=(_LOOP,)),
    DoctorCheck("modules", 120, lambda report, ctx: check_modules(report, ctx.docs),
                evidence=(Evidence("slow", "slow_modules",
                                   lambda last: {"last": last, "limit": TOP_MODULES}),)),
)
