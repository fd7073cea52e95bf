"""`probe straggler`: which rank the others wait for, by how much, and each rank's step split.

Data (fan-out: ``/v1/collectives`` and the ``straggler_steps`` canned query per rank) ->
``diagnose.straggler.diagnose_stragglers`` (pure) -> ``render.verdicts`` -> printed by main.py.
"""

from __future__ import annotations

import click

from probe_protocol.query import QueryBody

from ..gather.evidence import straggler_evidence, straggler_verdict
from ..outcome import Outcome, verdict_outcome
from ..render.verdicts import render_straggler, straggler_json
from ..transport.fanout import fan_out, resolve_ranks
from ..transport.session import Session
from . import pass_session


@click.command("straggler")
@click.option("--last", type=click.IntRange(min=2), default=50, show_default=True,
              help="Look at the last N steps (and about 4N collectives).")
@click.option("--min-share", type=click.FloatRange(0, 1), default=0.1, show_default=True,
              help="Name a straggler only if the others spent at least this share of the "
                   "window waiting for it (beyond any other rank), and it is last more often "
                   "than chance (binomial test, p < 0.001).")
@pass_session
def command(session: Session, last: int, min_share: float) -> Outcome:
    """Name the slow rank: the one the others wait for in collectives, how much slower it is
    than the median rank, and every rank's step time split into forward, backward, optimizer
    and other. Exit code 0: no straggler; 4: one was found; 3: some ranks did not answer."""
    results = fan_out(session, resolve_ranks(session), straggler_evidence(last))
    verdict, steps = straggler_verdict(results, 4 * last, min_share)
    if session.output == "json":
        lines = [straggler_json(verdict, steps)]
    else:
        lines = render_straggler(verdict, {k: QueryBody.from_wire(v) for k, v in steps.items()})
    return verdict_outcome(session, verdict, results, lines)
