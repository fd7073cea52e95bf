"""`probe pause` / `probe resume`: hold every rank at the same step boundary, then release."""

from __future__ import annotations

import click

from probe_protocol.actions import ActionRequest

from ..outcome import Outcome, finish
from ..render.actions import render_paused, render_resumed
from ..transport.client import ProbeClient
from ..transport.fanout import run_live_on_ranks
from ..transport.session import Session
from ..transport.step_actions import requested_by, run_step_action
from . import pass_session
from ._step_options import at_step_option, step_outcome, wait_option


@click.command("pause")
@at_step_option
@wait_option
@pass_session
def pause(session: Session, at_step: int | None, wait_s: float) -> Outcome:
    """Hold every rank's training thread right after the same optimizer step.

    While held, `probe query`, `probe eval`, `probe backtrace` and step-boundary actions
    (`eval --next-step`, `checkpoint`, `lr`) still work; they run at the held step. No rank
    sits in a collective meanwhile, so collective timeouts do not fire. `probe resume`
    releases every rank.
    """
    so = run_step_action(session, ActionRequest(kind="pause"), at_step=at_step, wait_s=wait_s)
    return step_outcome(session, so, lambda ok: render_paused(ok, session.colour))


@click.command("resume")
@pass_session
def resume(session: Session) -> Outcome:
    """Release ranks held by `probe pause` (and cancel pauses not reached yet)."""
    results = run_live_on_ranks(session, ProbeClient.resume, requested_by())
    return finish(session, results, lambda ok: render_resumed(ok, session.colour))
