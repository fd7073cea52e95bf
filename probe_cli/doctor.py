"""`probe doctor`'s diagnoses: pure functions from what every rank answered to ranked findings.

No I/O here; ``commands/doctor.py`` gathers. Each check looks at one thing a user would otherwise
have to know to ask about, and returns ``Finding``s (something to look at, with its evidence and
the next command to run) or a one-line ``fine`` note (checked, nothing wrong), or says why it
could not check (``unchecked``: the table is not recorded, the rank did not answer).

Severity: ``critical`` (the job is stuck or its numbers are garbage: a hang, a stalled rank,
NaN/Inf, CUDA OOMs), ``warning`` (it runs, but worse than it should: a straggler, data-bound or
collective-bound steps, memory growing step over step, clipping on almost every step, a zero
or non-finite LR), ``info`` (the state worth knowing: learning rate and clipping, the slowest
modules by their own time; module times are attributions, so they inform, never alarm).
``probe doctor`` exits 4 when any finding is critical or a warning.

Thresholds are module constants, chosen so a healthy toy job on 2 busy cores stays quiet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .group import rank_label
from .hang import Verdict, where
from .straggler import arrivals, diagnose_stragglers

CRITICAL, WARNING, INFO = "critical", "warning", "info"
_ORDER = {CRITICAL: 0, WARNING: 1, INFO: 2}

#: DataLoader wait above this share of step time is a finding.
DATA_WAIT_SHARE = 0.3
#: Time inside explicit collectives above this share of wall time is a finding.
COLLECTIVE_SHARE = 0.3
#: Memory growth: at least this many MiB over the window, and this fraction of the start.
GROWTH_MIB = 16.0
GROWTH_FRACTION = 0.05
#: A rank with no optimizer step for max(STALL_STEPS × its median step, min_wait) is stalled.
STALL_STEPS = 20
#: Clipping on at least this share of the steps that clipped at all: the LR may be too high.
CLIP_SHARE = 0.9
#: A straggler the others wait for at least this share of the time (`probe straggler`: 5%).
STRAGGLER_SHARE = 0.2
#: CUDA: warn when fewer than this many steps of growth are left before the device is full.
OOM_STEPS = 1000


@dataclass(slots=True)
class Finding:
    severity: str
    check: str
    title: str
    evidence: list[str] = field(default_factory=list)
    next: str = ""
    ranks: list[int] = field(default_factory=list)
    score: float = 0.0  # orders findings of one severity: bigger first

    def to_json(self) -> dict[str, Any]:
        return {"severity": self.severity, "check": self.check, "title": self.title,
                "evidence": self.evidence, "next": self.next, "ranks": self.ranks}


@dataclass(slots=True)
class RankDoc:
    """What one rank answered to doctor's second round. Each ``*_rows`` is a list of dicts
    (a canned query's rows) or None when that query failed; ``errors`` says why."""

    rank: int
    state: dict[str, Any] | None = None
    grads: dict[str, Any] | None = None
    loop: list[dict[str, Any]] | None = None
    memory: list[dict[str, Any]] | None = None
    metrics: list[dict[str, Any]] | None = None
    slow: list[dict[str, Any]] | None = None
    frames: tuple[dict[str, Any], ...] = ()
    collectives: tuple[dict[str, Any], ...] = ()
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Report:
    findings: list[Finding] = field(default_factory=list)
    fine: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)

    @property
    def problem(self) -> bool:
        return any(f.severity != INFO for f in self.findings)

    def ranked(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: (_ORDER[f.severity], -f.score))


def num(v: Any) -> float | None:
    """A wire number (NaN and ±Inf arrive as strings) as float; None stays None."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, str):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(v)
    return float(v)


def rows_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    cols = body.get("columns") or []
    return [dict(zip(cols, row)) for row in body.get("rows") or []]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _first(doc: RankDoc) -> dict[str, Any]:
    return (doc.loop or [{}])[0]


# -- the checks ---------------------------------------------------------------------------


def check_hang(report: Report, verdict: Verdict) -> None:
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
        step_ms = num(_first(d).get("step_ms")) or 0.0
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
        place, frames = where(d.frames)
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
        evidence, "probe backtrace", ranks, score=1e8))


def check_straggler(report: Report, docs: list[RankDoc]) -> None:
    rows = {d.rank: list(d.collectives) for d in docs if d.collectives}
    if len(rows) < 2:
        report.unchecked.append("straggler: needs collectives from 2 or more ranks")
        return
    v = diagnose_stragglers(rows, last=len(next(iter(rows.values()))),
                            min_share=STRAGGLER_SHARE)
    if v.problem:
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
    waited = {r: 0.0 for r in rows}
    for times in window:
        last = max(times.values())
        for r, t in times.items():
            waited[r] += last - t
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
    report.findings.append(Finding(
        WARNING, "collectives",
        f"COLLECTIVE WAIT: {rank_label(sorted(high))} "
        f"{'spends' if len(high) == 1 else 'spend'} {top:.0%} of the time waiting in "
        "collectives for their peers", evidence, "probe straggler", sorted(high), score=top))


def check_data_wait(report: Report, docs: list[RankDoc]) -> None:
    got = {d.rank: _first(d) for d in docs if d.loop and num(_first(d).get("steps"))}
    if not got:
        report.unchecked.append("DataLoader wait: no steps in python.step_stats yet")
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
