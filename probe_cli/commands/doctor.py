"""`probe doctor`: every canned diagnosis on every rank, as ranked findings with evidence and the
next command to run.

Data, two rounds of fan-out: (1) ``gather_hang`` of `probe hang` (backtraces and collectives of
every rank) gives the hang verdict, and its collectives feed the straggler and collective-wait
checks; (2) per rank ``GET /v1/doctor`` (loop state, optimizers), ``POST /v1/doctor/grads`` (a
one-shot NaN/Inf check of the gradients at the next step) and the canned queries below.
A query over a table this agent does not record becomes a "not checked" line, never a failure.
-> ``diagnose.doctor.diagnose`` (pure) -> ``render.doctor`` -> printed by main.py.
"""

from __future__ import annotations

from typing import Any

import click

from ..diagnose.doctor import diagnose, rank_doc, steps_seen
from ..diagnose.hang import rank_state
from ..diagnose.number_checks import MEMORY_WARMUP_STEPS, MEMORY_WINDOW_STEPS
from ..diagnose.time_checks import TOP_MODULES
from ..errors import EXIT_FAILURE, RankError
from ..outcome import Outcome, failure_summary, verdict_outcome
from ..render.doctor import doctor_header, render, render_json
from ..render.verdicts import rank_answers
from ..transport.client import ProbeClient
from ..transport.fanout import Call, RankTarget, fan_out, resolve_ranks
from ..transport.session import Session
from ..transport.wire import QueryBody
from . import pass_session
from .hang import gather_hang

#: (key, canned query, params): what each rank is asked in the second round. Memory growth and
#: the slowest modules are the queries `probe memory` and `probe slow` run, so the commands
#: cannot disagree with doctor (issue 18); doctor only picks the window.
QUERIES = (
    ("loop", "doctor_loop", ("last_steps",)),
    ("memory", "memory_growth", ("memory_steps", "warmup")),
    ("metrics", "doctor_metrics", ()),
    ("slow", "slow_modules", ("steps", "limit")),
)


def _second_round(last: int, grad_wait: float) -> Call:
    def call(client: ProbeClient, target: RankTarget) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": True, "rank": target.rank, "errors": {}}
        try:
            out["state"] = client.doctor()
        except RankError as e:
            out["errors"]["state"] = e.reason
        if out.get("state") is not None:
            try:
                out["grads"] = client.doctor_grads(grad_wait)
            except RankError as e:
                out["errors"]["grads"] = e.reason
        values = {"last_steps": last, "steps": last, "warmup": MEMORY_WARMUP_STEPS,
                  "memory_steps": MEMORY_WINDOW_STEPS,
                  "limit": TOP_MODULES}
        for key, name, params in QUERIES:
            try:
                body = client.canned(name, **{p.removeprefix("memory_"): values[p]
                                              for p in params})
                out[key] = QueryBody.from_wire(body).records()
            except RankError as e:
                out["errors"][key] = _short(e)
        return out

    return call


def _short(e: RankError) -> str:
    """'Catalog Error: Table with name metrics does not exist!...' -> 'not recorded by ...'."""
    msg = getattr(e, "body", {}).get("error") if hasattr(e, "body") else None
    text = str(msg or e.reason)
    if "does not exist" in text or "unknown canned query" in text.lower() or "404" in text:
        return "not recorded by this agent version"
    return text.split("\n")[0][:160]


@click.command("doctor")
@click.option("--last", type=click.IntRange(min=3), default=50, show_default=True,
              help="Look at the last N steps on every rank.")
@click.option("--min-wait", type=click.FloatRange(min=0), default=None,
              help="A collective entered, or a step not finished, this many seconds ago counts "
                   "as stuck. Default: from the job's own rhythm (as `probe hang`).")
@pass_session
def command(session: Session, last: int, min_wait: float | None) -> Outcome:
    """Run every diagnosis on every rank and print ranked findings, each with its evidence and
    the next command to run: a hang, a stalled rank, NaN/Inf in gradients or logged metrics,
    CUDA OOMs, memory growing step over step (and the headroom left on CUDA), a straggler,
    time waiting in collectives and in the DataLoader, learning rate and gradient clipping, and
    the slowest modules.

    Exit code 0: nothing found; 4: a problem was found (critical or warning); 3: nothing found
    but some ranks did not answer; 1: no rank answered.
    """
    verdict, first = gather_hang(session, min_wait)
    answered = [r for r in first if r.ok]
    if not answered:
        out = Outcome(exit_code=EXIT_FAILURE)
        out.stderr = failure_summary(first, session.timeout, session.target_note)
        return out
    urls = {r.url for r in answered}
    targets = [t for t in resolve_ranks(session) if t.endpoint.label in urls]
    grad_wait = max(0.1, min(2.0, session.timeout / 2))
    second = {r.rank: r for r in fan_out(session, targets, _second_round(last, grad_wait))}
    docs = []
    for r in answered:
        d = second.get(r.rank)
        docs.append(rank_doc(rank_state(r), d.data if d is not None and d.ok else None))
    report = diagnose(verdict, docs, verdict.threshold_s or 5.0)
    if session.output == "json":
        lines = [render_json(report, rank_answers(first))]
    else:
        lines = render(report, doctor_header([r.rank for r in answered], steps_seen(docs)))
    return verdict_outcome(session, report, first, lines)
