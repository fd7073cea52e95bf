"""Shared by the commands that run canned diagnostics (slow, memory, steps, trace --perfetto).

The agent serves the queries of ``sql/queries/`` by name (``POST /v1/queries/{name}`` with the
values of their ``-- params:``), so the CLI ships no SQL and an agent always runs the query
written for its own schema. The answer has the same body as ``POST /v1/query``.
"""

from __future__ import annotations

from typing import Any

from probe_protocol.query import QueryBody

from ..errors import RankError
from ..outcome import Outcome, finish
from ..render.text import query_notes, render_query_csv, render_query_table
from ..result import RankResult
from ..transport.fanout import run_on_ranks
from ..transport.rank_client import RankClient
from ..transport.session import Session


def run_canned(session: Session, name: str, **params: Any) -> list[RankResult]:
    """One canned query on every rank: ``list[RankResult]`` in rank order."""
    return run_on_ranks(session, RankClient.canned, name, **params)


def render_rows(session: Session, ok: list[RankResult]) -> list[str]:
    """One table with a rank column (or CSV with --csv)."""
    if session.output == "csv":
        return render_query_csv(ok)
    return render_query_table(ok, session.colour)


def canned_outcome(session: Session, name: str, empty_hint: str, **params: Any) -> Outcome:
    """Run ``name`` everywhere and print it as one table; ``empty_hint`` goes to stderr when
    every rank answered with no rows (why, and what to do)."""
    results = run_canned(session, name, **params)
    out = finish(session, results, lambda ok: render_rows(session, ok))
    ok = [r for r in results if r.ok]
    out.stderr[:0] = query_notes(ok)
    if ok and not any(QueryBody.from_wire(r.data).rows for r in ok) and session.output == "text":
        out.stderr.insert(0, f"probe: no rows yet: {empty_hint}")
    return out


def comm_row(client: RankClient) -> dict[str, Any] | None:
    """This rank's ``doctor_comm`` row (collectives and steps recorded), None when unread: a
    job whose ranks never communicate is not data-parallel (GB_tok, the memory levers)."""
    try:
        rows = QueryBody.from_wire(client.canned("doctor_comm")).records()
    except RankError:  # an agent without the query: the job is taken as it says it is
        return None
    return rows[0] if rows else None
