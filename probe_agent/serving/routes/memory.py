"""Memory routes: ``GET /v1/memory/tensors?top=N``, the live tensors grouped by device, dtype
and shape (collectors/tensors.py), with each group's change in count since the previous call
(on the query pool; holds the GIL for one pass over the GC's objects); and
``POST /v1/memory/snapshot?ahead=N&wait=S``, the CUDA allocator's history over the next N steps
as the pickle pytorch.org/memory_viz opens (collectors/cuda_history.py; 409 without CUDA)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from probe_protocol import routes
from probe_protocol.bodies import TensorsBody

from ...collectors.cuda_history import HistoryWindow, NoCudaError
from ...collectors.tensors import TensorCensus
from ...errors import ConflictError
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


def _window(request: Request) -> HistoryWindow:
    state = request.app.state
    window = getattr(state, "history", None)
    if window is None:
        agent = state.agent
        window = state.history = HistoryWindow(agent.stepclock, agent.collectors.oom)
    return window


@router.post(routes.MEMORY_SNAPSHOT.path)
async def snapshot(
    request: Request,
    ahead: int | None = Query(None, ge=1, le=1000, description="steps to record (default 1)"),
    steps: int | None = Query(None, ge=1, le=1000, description="ahead's old name (older CLIs)"),
    wait: float = Query(60.0, gt=0, le=600, description="seconds to wait for them at most"),
) -> Response:
    """Record the allocator's history for the next ``ahead`` steps and answer the snapshot
    pickle (``application/octet-stream``; headers: the rank, ``X-Probe-Steps: first-last``)."""
    steps = ahead or steps or 1
    agent = request.app.state.agent
    window = _window(request)
    try:
        # the default executor: the query pool must not wait out a window of steps
        data, first, last = await asyncio.get_running_loop().run_in_executor(
            None, window.record, steps, wait)
    except NoCudaError as e:
        raise ConflictError(str(e)) from None
    except RuntimeError as e:
        raise ConflictError(str(e)) from None
    return Response(data, media_type="application/octet-stream",
                    headers={routes.RANK_HEADER: str(agent.rank),
                             routes.STEPS_HEADER: f"{first}-{last}"})
