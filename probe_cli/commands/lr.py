"""`probe lr --scale F | --set LR`: change every optimizer's LR at the same step on every rank."""

from __future__ import annotations

import click

from ..outcome import Outcome
from ..render_actions import render_lr
from ..session import Session
from ..steps import at_step_option, run_step_action, step_outcome, wait_option
from . import pass_session


@click.command("lr")
@click.option("--scale", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Multiply every learning rate by this (0.1 = ten times lower).")
@click.option("--set", "set_to", type=click.FloatRange(min=0), default=None, metavar="LR",
              help="Set every learning rate to this value.")
@at_step_option
@wait_option
@pass_session
def command(session: Session, scale: float | None, set_to: float | None, at_step: int | None,
            wait_s: float) -> Outcome:
    """Change the learning rate of every param group of every optimizer, on every rank, right
    after the same optimizer step. LR schedulers are rescaled too (base LRs and the like), so
    the change survives their next step. Prints the LR before and after per rank.
    """
    if (scale is None) == (set_to is None):
        raise click.UsageError("give exactly one of --scale F or --set LR")
    body = {"kind": "lr", "scale": scale} if scale is not None else {"kind": "lr", "set": set_to}
    so = run_step_action(session, body, at_step=at_step, wait_s=wait_s)
    return step_outcome(session, so, lambda ok: render_lr(ok, session.colour))
