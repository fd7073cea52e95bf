"""`probe doctor`: every canned diagnosis on every rank, as ranked findings with evidence and the
next command to run.

Data, two rounds of fan-out: (1) ``gather_hang`` of `probe hang` (backtraces and collectives of
every rank) gives the hang verdict, and its collectives feed the straggler and collective-wait
checks; (2) per rank ``GET /v1/doctor`` (loop state, optimizers), ``POST /v1/doctor/grads`` (a
one-shot NaN/Inf check of the gradients at the next step) and the ``doctor_*`` canned queries.
A query over a table this agent does not record becomes a "not checked" line, never a failure.
-> ``doctor_health.diagnose`` (pure) -> ``render`` lines -> printed by main.py.
"""

from __future__ import annotations

from typing import Any

import click

from ..client import ProbeClient
from ..doctor import RankDoc, rows_of
from ..doctor_health import diagnose, render, render_json
from ..errors import EXIT_FAILURE, EXIT_FINDING, EXIT_OK, EXIT_PARTIAL, RankError
from ..fanout import RankTarget, fan_out, resolve_ranks
from ..group import rank_label
from ..outcome import Outcome, failure_summary
from ..session import Session
from . import pass_session
from .hang import gather_hang, rank_state

#: (key, canned query, params): what each rank is asked in the second round.
QUERIES = (
    ("loop", "doctor_loop", ("last_steps",)),
    ("memory", "doctor_memory", ("last_steps",)),
    ("metrics", "doctor_metrics", ()),
    ("slow", "doctor_slow_modules", ("last_steps", "top")),
)


def _second_round(last: int, grad_wait: float) -> Any:
    def call(client: ProbeClient, target: RankTarget) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": True, "rank": target.rank, "errors": {}}
        try:
            out["state"] = client.request("GET", "/v1/doctor")
        except RankError as e:
            out["errors"]["state"] = e.reason
        if out.get("state") is not None:
            try:
                out["grads"] = client.request("POST", "/v1/doctor/grads",
                                              params={"wait": grad_wait})
            except RankError as e:
                out["errors"]["grads"] = e.reason
        values = {"last_steps": last, "top": 5}
        for key, name, params in QUERIES:
            try:
                body = client.request("POST", f"/v1/queries/{name}",
                                      json={"params": {p: values[p] for p in params}})
                out[key] = rows_of(body)
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
@click.option("--min-wait", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="A collective entered, or a step not finished, this many seconds ago counts "
                   "as stuck.")
@pass_session
def command(session: Session, last: int, min_wait: float) -> Outcome:
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
        s = rank_state(r)
        d = second.get(r.rank)
        data = d.data if d is not None and d.ok and d.data else {}
        docs.append(RankDoc(
            rank=s.rank, state=data.get("state"), grads=data.get("grads"),
            loop=data.get("loop"), memory=data.get("memory"), metrics=data.get("metrics"),
            slow=data.get("slow"), frames=s.frames, collectives=s.collectives,
            errors=data.get("errors") or {}))
    report = diagnose(verdict, docs, min_wait)
    steps = sorted({(d.state or {}).get("clock", {}).get("step") for d in docs} - {None})
    at = f", step {steps[-1]}" if len(steps) == 1 else (
        f", steps {steps[0]}-{steps[-1]}" if steps else "")
    header = f"probe doctor: {rank_label([r.rank for r in answered])} answered{at}"
    out = Outcome()
    if session.output == "json":
        ranks = [{"rank": r.rank, "url": r.url, "ok": r.ok,
                  "error": None if r.ok else getattr(r.error, "reason", str(r.error))}
                 for r in first]
        out.stdout.append(render_json(report, ranks))
    else:
        out.stdout = render(report, header)
    out.stderr = failure_summary(first, session.timeout, session.target_note)
    out.exit_code = EXIT_FINDING if report.problem else (EXIT_PARTIAL if out.stderr else EXIT_OK)
    return out

