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

import time

import click

from ..diagnose import time_checks
from ..diagnose.doctor import diagnose, rank_doc, steps_seen
from ..diagnose.ends import ages_lines, check_ends, ends_lines, went_wrong
from ..diagnose.hang import HangVerdict
from ..diagnose.hang_state import rank_state
from ..errors import EXIT_FAILURE
from ..gather.evidence import doctor_evidence
from ..gather.postmortem import last_steps_lines, session_job
from ..outcome import Outcome, failure_summary, verdict_outcome
from ..render.doctor import doctor_header, render, render_json
from ..render.verdicts import rank_answers
from ..result import RankResult
from ..transport.fanout import fan_out, resolve_ranks
from ..transport.session import Session
from . import pass_session
from .hang import gather_hang


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
    verdict = recheck_stuck(session, min_wait, verdict, first)
    answered = [r for r in first if r.ok]
    if not answered:
        out = Outcome(exit_code=EXIT_FAILURE)
        out.stderr = failure_summary(first, session.timeout, session.target_note)
        return out
    urls = {r.url for r in answered}
    targets = [t for t in resolve_ranks(session) if t.endpoint.label in urls]
    grad_wait = max(0.1, min(2.0, session.timeout / 2))
    second = {r.rank: r for r in fan_out(session, targets, doctor_evidence(last, grad_wait))}
    docs = []
    for r in answered:
        d = second.get(r.rank)
        docs.append(rank_doc(rank_state(r), d.data if d is not None and d.ok else None))
    report = diagnose(verdict, docs, verdict.threshold_s or 5.0)
    job = session_job(session)
    if job is not None:  # a dead job: a rank that died of an error is a finding
        check_ends(report, job)
    if session.output == "json":
        lines = [render_json(report, rank_answers(first))]
    else:
        lines = render(report, doctor_header([r.rank for r in answered], steps_seen(docs)))
    if job is None or session.output == "json":
        return verdict_outcome(session, report, first, lines)
    # A dead job: how each rank ended (tracebacks, first to go wrong first), when each copy
    # was taken, and the steps before it lead.
    wrong = went_wrong(job)
    lines = [*ends_lines(job), *ages_lines(job), *last_steps_lines(job, [r.rank for r in wrong]),
             "", *lines]
    return verdict_outcome(session, report, first, lines)


#: How long doctor reads a "does not run Python" verdict again before it stands.
RECHECK_S = 8.0


def recheck_stuck(session: Session, min_wait: float | None, verdict: HangVerdict,
                  first: list[RankResult]) -> HangVerdict:
    """A hang verdict resting only on ranks too slow to answer (their GIL held, or a busy
    node) is read again for up to RECHECK_S: a fresh read with no hang, or every suspect's
    heartbeat step moved on, is no hang (time_checks.kept_stepping). A rank whose GIL is
    really held neither answers nor steps, and the first verdict stands."""
    if not time_checks.blames_only_gil(verdict):
        return verdict
    before = heartbeat_steps(first)
    deadline = time.monotonic() + RECHECK_S
    while time.monotonic() < deadline:
        time.sleep(1.0)
        again, results = gather_hang(session, min_wait)
        if not again.problem:
            return again
        moved = time_checks.kept_stepping(verdict, before, heartbeat_steps(results))
        if moved is not None:
            return moved
    return verdict


def heartbeat_steps(results: list[RankResult]) -> dict[int, int | None]:
    """Each rank's last step as its backtrace answer says (the watchdog's heartbeat record
    when the agent's Python did not answer in time)."""
    out: dict[int, int | None] = {}
    for r in results:
        if r.ok and r.rank is not None and isinstance(r.data, dict):
            bt = r.data.get("backtrace") or {}
            step = bt.get("step") if isinstance(bt, dict) else None
            out[r.rank] = step if isinstance(step, int) else None
    return out
