"""`probe slow`: the slowest modules over the last K traced steps, forward against backward."""

from __future__ import annotations

import click

from ..outcome import Outcome
from ..transport.session import Session
from . import pass_session
from ._canned import canned_outcome
from ._window import last_option


@click.command("slow")
@last_option(20, 1, "Look at the last N traced steps of each rank.")
@click.option("--limit", type=click.IntRange(min=1), default=15, show_default=True,
              help="Modules shown per rank.")
@pass_session
def command(session: Session, last: int, limit: int) -> Outcome:
    """Slowest modules of every rank, by self time per step: each call's time minus the calls
    nested in that same call, median per call times the median calls per step (a few steps
    slowed by something else do not count), split into forward and backward; an activation
    checkpoint's recompute counts as backward; a module's own backward is what autograd runs
    for it outside its children's (an attention core between its projections is the attention
    module's). The optimizer step shows as its class. pct is
    the share of all self time. `probe doctor` names the same module first. From
    python.torch_trace (canned query slow_modules)."""
    return canned_outcome(
        session, "slow_modules",
        "no traced steps (the agent traces every 10th step by default; `probe trace on` traces "
        "every step from the next one)",
        last=last, limit=limit,
    )
