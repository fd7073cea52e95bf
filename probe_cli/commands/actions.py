"""`probe actions` and `probe actions cancel ID`: the step-boundary action queue of every rank."""

from __future__ import annotations

import click

from ..outcome import Outcome, finish
from ..render.actions import render_action_list, render_cancelled
from ..transport.client import ProbeClient
from ..transport.fanout import run_live_on_ranks
from ..transport.session import Session
from . import pass_session


@click.group("actions", invoke_without_command=True)
@click.pass_context
def actions(ctx: click.Context) -> Outcome | None:
    """List every rank's step-boundary actions: queued, running and recently finished."""
    if ctx.invoked_subcommand is not None:
        return None
    session = ctx.find_object(Session)
    assert session is not None  # main.py's group always sets it
    results = run_live_on_ranks(session, ProbeClient.actions)
    return finish(session, results, lambda ok: render_action_list(ok, session.colour))


def _cancel_command() -> click.Command:
    # Built in a function: a module-level command would also be registered as `probe cancel`.
    @click.command("cancel")
    @click.argument("action_id", metavar="ID")
    @pass_session
    def cancel(session: Session, action_id: str) -> Outcome:
        """Cancel action ID on every rank. A queued action is dropped; one whose ranks are
        still agreeing is skipped on all of them; a running one cannot be interrupted."""
        results = run_live_on_ranks(session, ProbeClient.cancel_action, action_id)
        return finish(session, results, lambda ok: render_cancelled(ok, session.colour))

    return cancel


actions.add_command(_cancel_command())
