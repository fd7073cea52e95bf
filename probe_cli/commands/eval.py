"""`probe eval CODE`: run Python in every rank; identical outputs grouped by rank set."""

from __future__ import annotations

import sys
import time
import uuid

import click

from ..outcome import Outcome, finish
from ..render.text import render_eval, render_eval_cancelled, render_eval_failures
from ..result import RankResult
from ..transport.client import ProbeClient
from ..transport.fanout import calling_live, fan_out, resolve_ranks, run_live_on_ranks
from ..transport.session import Session
from . import pass_session
from ._step_options import at_step_or_now_option, check_exclusive, wait_option


@click.command("eval")
@click.argument("code", required=False)
@at_step_or_now_option
@click.option("--next-step", is_flag=True,
              help="Run on the training thread right after the next optimizer step, the same "
                   "step on every rank (the smallest step no rank has passed yet).")
@wait_option
@click.option("--cancel", "cancel_id", metavar="ID",
              help="Cancel eval ID (named when an eval outlived PROBE_EVAL_TIMEOUT_S) on every "
                   "rank: each further line it runs raises, even inside `try: ... except: "
                   "pass`. A step-boundary eval is cancelled with `probe actions cancel ID`.")
@pass_session
def command(session: Session, code: str | None, at_step: int | None, next_step: bool,
            wait_s: float, cancel_id: str | None) -> Outcome:
    """Run CODE in every rank and print what it printed plus the repr of a trailing
    expression. CODE `-` reads the code from stdin.

    With --at-step N or --next-step, CODE runs on every rank's training thread right after
    that optimizer step (so collectives inside it match), instead of on an agent thread now.

    Ranks with identical output are shown once under their rank list. A rank whose code raised
    prints its traceback on stderr; the exit code is then 1 (all raised) or 3 (some did).
    """
    if cancel_id is not None:
        if code is not None or at_step is not None or next_step:
            raise click.UsageError("--cancel ID takes no CODE, --at-step or --next-step")
        results = run_live_on_ranks(session, ProbeClient.cancel_eval, cancel_id)
        return finish(session, results, lambda ok: render_eval_cancelled(ok, session.colour))
    if code is None:
        raise click.UsageError("give the CODE to run (or --cancel ID)")
    if code == "-":
        code = sys.stdin.read()  # click 8.5 deprecated get_text_stream (gone in 9)
    check_exclusive(at_step, next_step)
    if at_step is not None or next_step:  # a step-boundary action (step_actions.py)
        from ._step_eval import step_eval

        return step_eval(session, code, at_step, wait_s)
    # One id on every rank: a runaway eval is then cancelled everywhere with the id it names,
    # and a rank whose answer was lost is asked again under it (never run twice).
    eval_id = uuid.uuid4().hex[:8]
    results = _eval_everywhere(session, code, eval_id)
    out = finish(
        session,
        results,
        lambda ok: render_eval(ok, session.colour),
        render_failed=lambda failed: render_eval_failures(
            failed, session.colour, labels=len(results) > 1
        ),
    )
    out.stderr.extend(still_running_lines(results, eval_id, session.timeout))
    return out


def still_running_lines(results: list[RankResult], eval_id: str, timeout: float) -> list[str]:
    """For the ranks the CLI stopped waiting for: the eval's id, which the agents keep it
    under, so that the operator can stop it or see how it ended (it was not cancelled)."""
    from ..outcome import who
    from ..transport.step_actions import answer_lost

    lost = [r for r in results if not r.ok and answer_lost(r)]
    if not lost:
        return []
    return [f"probe: eval {eval_id} may still be running on {who(lost)}: the CLI stopped "
            f"waiting after {timeout:g} s (--timeout), the agent stops it after "
            "PROBE_EVAL_TIMEOUT_S",
            f"hint: `probe eval --cancel {eval_id}` stops it now; GET /v1/evals/{eval_id} on "
            "the rank says how it ended; a longer --timeout waits for it"]


def _eval_everywhere(session: Session, code: str, eval_id: str) -> list[RankResult]:
    """``POST /v1/eval`` on every rank; a rank whose answer was lost (the watchdog's 504 while
    its GIL is held: the eval was handed to the agent and will run) gets the same request
    again, a few times over a few seconds. The agents treat the id as an idempotency key: the
    eval runs once, and the retry is answered with its result."""
    from ..transport.step_actions import SUBMIT_RETRY_S, answer_lost

    targets = resolve_ranks(session)
    call = calling_live(ProbeClient.eval, code, eval_id)
    results = fan_out(session, targets, call)
    by_label = {t.endpoint.label: t for t in targets}
    for pause in SUBMIT_RETRY_S:
        lost = [r for r in results if not r.ok and answer_lost(r) and r.url in by_label]
        if not lost:
            break
        time.sleep(pause)
        again = {r.url: r for r in fan_out(session, [by_label[r.url] for r in lost], call)}
        results = [again.get(r.url, r) for r in results]
    return results
