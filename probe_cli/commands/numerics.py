"""`probe numerics`: the loss and gradient health of every rank, judged: LOSS SPIKE (step, rank,
factor, the modules whose gradients jumped, the batch's sample indices), NaN/Inf (the first
step and rank, and where the value was born: module, op, forward or backward, produced or
received, sample), DIVERGING / NOT LEARNING, STALLED, LR TOO HIGH, CLIPPING and LR ZERO.

The same verdicts as `probe doctor` (diagnose/numerics.py), with each rank's numbers beside
them; ``--set NAME=VALUE`` changes the thresholds on every rank while the job runs.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

import click

from probe_protocol.query import QueryBody

from ..diagnose.clipping import check_clipping, check_lr_zero
from ..diagnose.findings import RankDoc, Report, num
from ..diagnose.guard_check import check_guard
from ..diagnose.nonfinite import check_nonfinite
from ..diagnose.numerics import TREND_WINDOW, check_numerics, spikes, thresholds
from ..errors import EXIT_USAGE, ProbeCLIError, RankError
from ..outcome import Outcome, verdict_outcome
from ..render.doctor import render
from ..render.verdicts import rank_answers
from ..transport.fanout import Call, RankTarget, fan_out, resolve_ranks
from ..transport.rank_client import RankClient, live
from ..transport.session import Session
from . import pass_session


def _pairs(values: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for v in values:
        name, _, raw = v.partition("=")
        try:
            number = float(raw)
        except ValueError:
            raise ProbeCLIError(f"numerics --set {v!r} refused: give NAME=NUMBER, e.g. "
                                "spike_factor=3", exit_code=EXIT_USAGE) from None
        if not name or not math.isfinite(number) or number < 0:
            raise ProbeCLIError(f"numerics --set {v!r} refused: give NAME=NUMBER with a "
                                "finite number >= 0", exit_code=EXIT_USAGE)
        out[name.strip()] = number
    return out


@click.command("numerics")
@click.option("--window", type=click.IntRange(min=20), default=TREND_WINDOW, show_default=True,
              help="Judge each rank's last N steps (and its first 20).")
@click.option("--set", "set_", multiple=True, metavar="NAME=VALUE",
              help="Change a threshold on every rank first (repeatable): spike_factor, "
                   "spike_mads, clip_share, clip_far, stall_ratio, high_ratio, chance_margin.")
@pass_session
def command(session: Session, window: int, set_: tuple[str, ...]) -> Outcome:
    """The loss and gradients of every rank, judged: a loss spike (the step, rank, factor, the
    modules whose gradients jumped most, the batch's DataLoader sample indices), NaN/Inf (the
    first step and rank, the module and op that produced it, forward or backward, and the
    sample), a loss diverging or sitting at chance level (ln of the number of classes), a loss
    stalled with tiny updates (LR too low), update/weight ratios far above ~1e-3 (LR too high),
    clipping on most steps (max_norm too small, or growing norms: the LR; a small trim while
    the loss falls is fine), and an LR of 0 after the schedule's end.

    Per rank: the last step's loss and gradient norm, the median loss of the last 10 steps, the
    median update/weight ratio of the traced steps, spikes, the first non-finite step.

    Exit code 0: nothing found; 4: a problem; 3: some ranks did not answer; 1: none did.
    --json: {problem, findings, fine, unchecked, thresholds, ranks: [{rank, ok, ...}],
    numbers: [{rank, step, loss, loss_median, grad_norm, update_ratio, spikes,
    first_nonfinite}]}.
    """
    values = _pairs(set_)
    results = fan_out(session, resolve_ranks(session), _gather(window, values))
    docs = []
    for r in results:
        if r.ok and r.data is not None:
            docs.append(RankDoc(rank=r.rank if r.rank is not None else -1,
                                state={"numerics": r.data.get("state")},
                                schedule=r.data.get("schedule"), errors=r.data.get("errors", {}),
                                answers={"numerics": r.data.get("rows"),
                                         "numeric_events": r.data.get("events")}))
    report = Report()
    check_nonfinite(report, docs)
    check_numerics(report, docs)
    check_guard(report, docs)
    check_clipping(report, docs)
    check_lr_zero(report, docs)
    t = thresholds(docs)
    numbers = [_numbers(d, t) for d in docs]
    if session.output == "json":
        body = {**report.to_dict(), "thresholds": t, "ranks": rank_answers(results),
                "numbers": numbers}
        lines = [json.dumps(body, indent=2, default=str)]
    else:
        lines = [_line(n) for n in numbers] + [""] + render(
            report, f"probe numerics: {len(docs)} rank{'s' if len(docs) != 1 else ''} answered")
        if values:
            lines.insert(0, "thresholds now: " + ", ".join(f"{k}={v:g}" for k, v in t.items()))
    return verdict_outcome(session, report, results, lines)


def _gather(window: int, values: dict[str, float]) -> Call:
    def call(client: RankClient, target: RankTarget) -> dict[str, Any]:
        agent = live(client, "numerics")  # the detector's state and thresholds: a live rank's
        if values:
            agent.set_numerics(values)
        out: dict[str, Any] = {"ok": True, "rank": target.rank, "errors": {}}
        out["state"] = agent.numerics().get("numerics")
        # errors are filed under the evidence keys the checks read (numerics, numeric_events):
        # a timed-out query is then "not read (why)", never "no steps recorded yet"
        for key, name, params, said in (
                ("rows", "numerics", {"window": window}, "numerics"),
                ("events", "numerics_events", {}, "numeric_events"),
                ("schedule", "schedule", {}, "schedule")):
            try:
                out[key] = QueryBody.from_wire(client.canned(name, **params)).records()
            except RankError as e:
                out["errors"][said] = f"not read: {e.reason}"
        return out

    return call


def _numbers(d: RankDoc, t: dict[str, float]) -> dict[str, Any]:
    rows = d.rows("numerics") or []
    losses = [x for x in (num(r.get("loss")) for r in rows[-10:]) if x is not None and
              math.isfinite(x)]
    ratios = [x for x in (num(r.get("update_ratio")) for r in rows) if x is not None and
              math.isfinite(x)]
    last = rows[-1] if rows else {}
    first = ((d.state or {}).get("numerics") or {}).get("first_nonfinite")
    return {"rank": d.rank, "step": last.get("step"), "loss": last.get("loss"),
            "loss_median": statistics.median(losses) if losses else None,
            "grad_norm": last.get("grad_norm"),
            "update_ratio": statistics.median(ratios) if ratios else None,
            "spikes": [s["step"] for s in spikes(rows, t)],
            "first_nonfinite": first.get("step") if first else None}


def _line(n: dict[str, Any]) -> str:
    def g(v: Any) -> str:
        x = num(v)
        return "-" if x is None else f"{x:.4g}"

    spikes_ = n["spikes"]
    return (f"rank {n['rank']}: step {n['step']}, loss {g(n['loss'])} (median of the last 10: "
            f"{g(n['loss_median'])}), gradient norm {g(n['grad_norm'])}, update/weight "
            f"{g(n['update_ratio'])}, spikes {', '.join(map(str, spikes_[:5])) or 'none'}"
            + (f", first NaN/Inf at step {n['first_nonfinite']}" if n["first_nonfinite"]
               else ""))
