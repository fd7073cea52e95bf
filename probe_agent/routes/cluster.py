"""Cluster routes (issue 4): collective state of this rank, for `probe hang` and friends.

``/v1/ranks`` (in core) serves the rank registry; this module serves what a cross-rank verdict
needs from one rank in one request.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Query, Request

router = APIRouter(prefix="/v1")


def _collective_rows(agent: Any, state: str | None, limit: int) -> dict[str, Any]:
    recorder = agent.collectors.get("collectives")
    rows = recorder.rows() if recorder is not None else []
    if state:
        rows = [r for r in rows if r["state"] == state]
    return {
        "recording": recorder is not None,
        "collectives": rows[-limit:],
        "now": time.time(),
    }


@router.get("/collectives")
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
    return {"ok": True, "rank": agent.rank, **body}
