"""`probe info`: who every rank is (host, pid, versions, uptime)."""

from __future__ import annotations

import click

from ..fanout import run_on_ranks
from ..outcome import Outcome, finish
from ..render import format_csv, info_rows, render_info
from ..result import RankResult
from ..session import Session
from . import pass_session


@click.command("info")
@pass_session
def command(session: Session) -> Outcome:
    """Every rank's host, pid, Python, torch and probe versions, and agent uptime."""
    results = run_on_ranks(session, "GET", "/v1/info")

    def render(ok: list[RankResult]) -> list[str]:
        if session.output == "csv":
            return format_csv(*info_rows(ok, raw=True))
        return render_info(ok, session.colour)

    return finish(session, results, render)
