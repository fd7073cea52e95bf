"""`probe hang`: one verdict for a stuck job, from every rank's collectives and main stack.

Data (``/v1/backtrace`` + ``/v1/collectives`` of every rank, asked one node at a time) ->
``diagnose.hang.diagnose`` (pure) -> ``render.verdicts`` lines -> printed by main.py.
"""

from __future__ import annotations

import json
from dataclasses import replace

import click

from ..diagnose.ends import ages_lines, ends_lines, evidence_at, survivors_line, timeout_line
from ..diagnose.hang import HangVerdict, diagnose
from ..diagnose.hang_state import rank_state
from ..errors import EXIT_FAILURE
from ..gather.evidence import hang_evidence_by_node
from ..gather.postmortem import session_job
from ..outcome import Outcome, failure_summary, verdict_outcome
from ..render.verdicts import hang_json, render_verdict
from ..result import RankResult
from ..transport.fanout import resolve_ranks
from ..transport.session import Session
from . import pass_session


def gather_hang(session: Session,
                min_wait: float | None) -> tuple[HangVerdict, list[RankResult]]:
    results = hang_evidence_by_node(session, resolve_ranks(session))
    states = [rank_state(r) for r in results]
    # ranks found up on this machine but not in the rank list never joined the group
    states = [replace(s, unjoined_pid=session.unjoined[s.rank]) if s.rank in session.unjoined
              and s.answered else s for s in states]
    return diagnose(states, min_wait_s=min_wait), results


@click.command("hang")
@click.option("--min-wait", type=click.FloatRange(min=0), default=None,
              help="Only collectives entered at least this many seconds ago count as waits. "
                   "Default: 4x this job's usual gap between collectives (at least 2 s; 5 s "
                   "until enough collectives are seen), so long steps are not hangs.")
@pass_session
def command(session: Session, min_wait: float | None) -> Outcome:
    """Name the rank(s) the others wait for, the collective and seq they wait in, and where
    the odd ranks are instead.

    Exit code 0: nothing stuck; 4: a problem was found (a hang, a failed collective, a rank
    that did not answer: the verdict names it); 1: nothing reachable (a job that has ended).
    """
    verdict, results = gather_hang(session, min_wait)
    job = session_job(session)
    if job is None and not any(r.ok for r in results) and not any(
            (rank_state(r).error or "").startswith("is dead") for r in results):
        # Nothing reachable and no watchdog reporting a death (a finished job, a wrong
        # address): no verdict to give, exit 1 as for any command ("rank -1 did not answer",
        # exit 4, was printed for a job that had ended).
        out = Outcome(exit_code=EXIT_FAILURE)
        out.stderr = failure_summary(results, session.timeout, session.target_note)
        return out
    if session.output == "json":
        lines = [hang_json(verdict, results)]
        if job is not None:  # a dead job: when each rank's account was taken (ages_lines)
            body = json.loads(lines[0])
            body["copies_taken_at"] = {str(r.rank): evidence_at(r)
                                       for r in sorted(job.ranks.values(), key=lambda r: r.rank)}
            lines = [json.dumps(body, indent=2)]
    else:
        lines = render_verdict(verdict)
    if job is not None and session.output != "json":  # a dead job: how each rank ended
        lines += [x for x in [timeout_line(job, verdict.waiting, verdict.mismatch),
                              survivors_line(job, list(verdict.culprits))] if x]
        lines += ages_lines(job) + ends_lines(job)
    # The verdict names silent ranks itself: no failure summary under it.
    return verdict_outcome(session, verdict, results, lines, summary=False)
