"""Memory routes: ``GET /v1/memory/tensors?top=N``, the live tensors grouped by device, dtype
and shape (collectors/tensors.py), with each group's change in count since the previous call.
Runs on the query pool; holds the GIL for one pass over the GC's objects."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Query, Request

from probe_protocol import routes
from probe_protocol.bodies import TensorsBody

from ...collectors.tensors import TensorCensus
from ...jsonsafe import jsonable

router = APIRouter()


def _census(request: Request) -> TensorCensus:
    state = request.app.state
    census = getattr(state, "census", None)
    if census is None:  # one per app, so count_change compares with this agent's last call
        agent = state.agent
        census = state.census = TensorCensus(agent.stepclock, agent.collectors.tracer)
    return census


def _take(agent: Any, census: TensorCensus, top: int) -> dict[str, Any]:
    from ...frameworks.discovery import discover

    optimizers = agent.stepclock.optimizers()
    models = list(discover(optimizers=optimizers).models) if optimizers else []
    return census.take(top, models)


@router.get(routes.MEMORY_TENSORS.path)
async def tensors(
    request: Request,
    top: int = Query(20, ge=1, le=10_000, description="groups returned, largest first"),
) -> dict[str, Any]:
    """Live tensors by (device, dtype, shape): ``groups`` [{device, dtype, shape, count, mib,
    kind (parameter | gradient | optimizer | other), holder, count_change}], ``tensors``,
    ``total_mib``, ``step`` and ``previous_step`` (of the last census; count_change is null on
    the first), ``census_ms``."""
    agent = request.app.state.agent
    census = _census(request)
    body = await asyncio.get_running_loop().run_in_executor(agent.query_pool, _take, agent,
                                                            census, top)
    return jsonable(TensorsBody(agent.rank, **body).to_wire())
