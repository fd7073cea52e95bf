"""Profile and flame routes.

A profile window is queued as a step-boundary action (``POST /v1/actions`` with kind
``profile``, routes/actions.py); these routes follow it and fetch its trace:

- ``GET /v1/profile/{id}?wait=S``: the window's state (recording, exporting, done, error), step
  spans, top operators and cost; ``wait`` holds the answer up to 30 s until it is done;
- ``GET /v1/profile/{id}/trace``: the Chrome trace file, streamed from disk in chunks (a trace
  can be hundreds of MB; nothing holds it in memory);
- ``POST /v1/flame {"seconds", "rate", "max_seconds"}``: start sampling this rank's Python
  stacks (one session at a time); ``GET /v1/flame/{id}?wait=S``: its state, then its folded
  stacks and cost.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from probe_protocol import routes
from probe_protocol.actions import FlameBody, FlameRequest, ProfileBody

from ...actions.profile import check_flame
from ...errors import ConflictError
from .bodies import openapi_body, read_body
from .core import _agent, _client

router = APIRouter()

def _profiling(request: Request) -> Any:
    return _agent(request).profiling


@router.get(routes.PROFILE.path)
async def get_profile(request: Request, profile_id: str, wait: float = 0.0) -> dict[str, Any]:
    """One rank's profile window; ``wait=S`` holds the answer until it is done (≤ 30 s)."""
    agent = _agent(request)
    w = await _profiling(request).windows.wait(profile_id, wait)
    return ProfileBody(agent.rank, step=agent.stepclock.current_step, now=time.time(),
                       profile=w.describe()).to_wire()


@router.get(routes.PROFILE_TRACE.path, response_model=None)
async def get_profile_trace(request: Request, profile_id: str) -> FileResponse:
    """The window's Chrome trace, streamed from disk."""
    agent = _agent(request)
    w = _profiling(request).window(profile_id)
    path = w.trace_path
    if w.state != "done" or path is None or not os.path.exists(path):
        why = ("removed: newer profiles replaced it" if w.state == "done" else
               f"the window is {w.state}" + (f" ({w.error})" if w.error else ""))
        raise ConflictError(f"no trace for profile {profile_id} on rank {agent.rank}: {why}",
                            reason="no-trace")
    return FileResponse(path, media_type="application/json",
                        headers={routes.RANK_HEADER: str(agent.rank)})


@router.post(routes.START_FLAME.path, openapi_extra=openapi_body(FlameRequest))
async def start_flame(request: Request) -> dict[str, Any]:
    """Start sampling this rank's Python stacks for ``seconds``; it ends by itself."""
    body = await read_body(request, FlameRequest)
    agent = _agent(request)
    profiling = _profiling(request)
    flame_id = body.id or uuid.uuid4().hex[:12]
    try:
        check_flame(body.seconds, body.rate, body.max_seconds)
    except Exception as e:
        profiling.audit("flame", flame_id, agent.stepclock.current_step,
                        f"flame {body.seconds:g} s at {body.rate:g} Hz", "refused",
                        getattr(e, "message", str(e)), 0.0, _client(request), body.requested_by)
        raise
    f = await run_in_threadpool(profiling.start_flame, flame_id, body.seconds, body.rate,
                                _client(request), body.requested_by, body.sampler)
    return FlameBody(agent.rank, step=agent.stepclock.current_step,
                     flame=f.describe(False)).to_wire()


@router.get(routes.FLAME.path)
async def get_flame(request: Request, flame_id: str, wait: float = 0.0) -> dict[str, Any]:
    """A flame session; ``wait=S`` holds the answer until it has finished (≤ 30 s)."""
    agent = _agent(request)
    f = await _profiling(request).flames.wait(flame_id, wait)
    return FlameBody(agent.rank, step=agent.stepclock.current_step, flame=f.describe()).to_wire()
