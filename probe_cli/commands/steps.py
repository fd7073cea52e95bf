"""`probe steps`: step-time trend per rank, then the outlier steps."""

from __future__ import annotations

from typing import Any

import click

from probe_protocol.envelope import Envelope
from probe_protocol.query import QueryBody

from ..outcome import Outcome, finish
from ..render.text import render_query_table
from ..result import RankResult
from ..transport.fanout import RankTarget, fan_out, resolve_ranks
from ..transport.rank_client import RankClient
from ..transport.session import Session
from . import pass_session
from ._window import last_option

TREND, OUTLIERS = "steps_trend", "steps_outliers"


@click.command("steps")
@last_option(100, 2, "Look at the last N steps of each rank.")
@click.option("--factor", type=click.FloatRange(min=1.0), default=2.0, show_default=True,
              help="A step slower than FACTOR x its rank's median step time is an outlier.")
@click.option("--limit", type=click.IntRange(min=1), default=10, show_default=True,
              help="Outlier steps shown per rank.")
@pass_session
def command(session: Session, last: int, factor: float, limit: int) -> Outcome:
    """Step time of every rank over the last K steps: median, p90, max, whether it is getting
    slower (trend_pct: newer half against older half) and samples/s; then the outlier steps,
    slowest first, and whether they were traced. From python.steps."""

    def both(client: RankClient, _target: RankTarget) -> dict[str, Any]:
        trend = client.canned(TREND, last=last)
        outliers = client.canned(OUTLIERS, last=last, factor=factor, limit=limit)
        rank = Envelope.from_wire(trend).rank
        return {"ok": True, "rank": rank, "trend": trend, "outliers": outliers}

    results = fan_out(session, resolve_ranks(session), both)

    def render(ok: list[RankResult]) -> list[str]:
        lines = render_query_table([_part(r, "trend") for r in ok], session.colour)
        out = [_part(r, "outliers") for r in ok]
        if any(QueryBody.from_wire(r.data).rows for r in out):
            lines += ["", f"Outlier steps (> {factor:g}x the rank's median):"]
            lines += render_query_table(out, session.colour)
        else:
            lines += ["", f"No outlier steps (> {factor:g}x the rank's median)."]
        return lines

    return finish(session, results, render)


def _part(r: RankResult, key: str) -> RankResult:
    return RankResult(r.rank, r.url, r.ok, (r.data or {}).get(key), r.error, r.host, r.pid)
