"""Cluster routes: collective state of this rank, for `probe hang` and friends.

``/v1/ranks`` (in core) serves the rank registry; this module serves what a cross-rank verdict
needs from one rank in one request.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Query, Request

from probe_protocol import routes
from probe_protocol.bodies import CollectivesBody, QueriesBody
from probe_protocol.query import CannedRequest, QueryBody

from ...errors import NotFoundError, QueryError
from .bodies import openapi_body, read_body

if TYPE_CHECKING:
    from ..parts import AgentParts

router = APIRouter()


def _collective_rows(agent: AgentParts, state: str | None, limit: int) -> CollectivesBody:
    recorder = agent.collectors.collectives
    rows = recorder.rows() if recorder is not None else []
    if state:
        rows = [r for r in rows if r["state"] == state]
    return CollectivesBody(agent.rank, recording=recorder is not None,
                           collectives=tuple(rows[-limit:]), now=time.time())


@router.get(routes.COLLECTIVES.path)
async def collectives(
    request: Request,
    state: str | None = Query(None, description="only rows in this state: pending, done, failed"),
    limit: int = Query(200, ge=1, le=10_000, description="the newest N rows"),
) -> dict[str, Any]:
    """Recent collectives of this rank (``python.collectives`` rows, oldest first) and the
    agent's clock, so a client can age pending calls without trusting its own."""
    agent = request.app.state.agent
    body = await asyncio.get_running_loop().run_in_executor(
        agent.query_pool, _collective_rows, agent, state, limit
    )
    return body.to_wire()


#: What the look-back window was called before it was `last` in every canned query; an older
#: CLI or script still sends these, and gets the same rows.
_OLD_WINDOW_PARAMS = ("steps", "last_steps")


def _window_renamed(takes: tuple[str, ...], params: dict[str, Any]) -> dict[str, Any]:
    if "last" not in takes or "last" in params:
        return params
    old = [p for p in _OLD_WINDOW_PARAMS if p in params and p not in takes]
    if len(old) != 1:
        return params
    return {**{k: v for k, v in params.items() if k != old[0]}, "last": params[old[0]]}


def _canned(agent: AgentParts, name: str, params: dict[str, Any]) -> Any:
    from ...store.catalog import load_queries

    queries = load_queries()
    q = queries.get(name)
    if q is None:
        raise NotFoundError(f"no canned query {name!r}; known: {', '.join(sorted(queries))}")
    params = _window_renamed(q.params, params)
    missing = [p for p in q.params if p not in params]
    extra = [p for p in params if p not in q.params]
    if missing or extra:
        raise QueryError(
            f"query {name} takes params {', '.join(q.params) or '(none)'}; "
            f"missing: {', '.join(missing) or '-'}; unknown: {', '.join(extra) or '-'}"
        )
    return agent.store.query(q.sql, params=params or None)  # DuckDB binds $name from a dict


@router.get(routes.QUERIES.path)
async def list_queries(request: Request) -> dict[str, Any]:
    """The canned diagnostics of sql/queries/ (name, description, params)."""
    from ...store.catalog import load_queries

    agent = request.app.state.agent
    return QueriesBody(agent.rank, tuple(
        {"name": q.name, "description": q.description, "params": list(q.params)}
        for q in load_queries().values()
    )).to_wire()


@router.post(routes.CANNED_QUERY.path, openapi_extra=openapi_body(CannedRequest))
async def run_query(request: Request, name: str) -> dict[str, Any]:
    """Run one canned query by name: the same body as ``POST /v1/query``."""
    body = await read_body(request, CannedRequest)
    agent = request.app.state.agent
    res = await asyncio.get_running_loop().run_in_executor(
        agent.canned_pool, _canned, agent, name, body.params
    )
    return QueryBody(agent.rank, tuple(res.columns), tuple(res.types), tuple(res.rows),
                     res.truncated, round(res.elapsed_ms, 3)).to_wire()
