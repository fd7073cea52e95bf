"""Trace routes: read and change the torch tracing mode at run time.

``GET /v1/trace`` -> the tracer's state; ``POST /v1/trace {"mode": "on"|"off"|"every:N"}`` sets
the mode. With an optimizer the new mode takes effect at the next step boundary (a step is never
half traced); before the first optimizer step it takes effect at once. The timeline export
(`probe trace --perfetto`) is built by the CLI from the ``trace_timeline`` canned query.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from probe_protocol import routes
from probe_protocol.bodies import TraceBody, TraceRequest

from ...errors import ConflictError, QueryError
from .bodies import openapi_body, read_body

router = APIRouter()


def _tracer(request: Request) -> Any:
    agent = request.app.state.agent
    tracer = agent.collectors.tracer
    if tracer is None:
        raise ConflictError(
            "torch tracing is not running in this agent (see the agent's log for why)"
        )
    return agent, tracer


@router.get(routes.TRACE.path)
async def get_trace(request: Request) -> dict[str, Any]:
    """The tracing mode, whether the current step is traced, and failure counts."""
    agent, tracer = _tracer(request)
    return TraceBody(agent.rank, **tracer.state()).to_wire()


@router.post(routes.SET_TRACE.path, openapi_extra=openapi_body(TraceRequest))
async def set_trace(request: Request) -> dict[str, Any]:
    """Change the tracing mode (takes effect at the next optimizer step boundary)."""
    body = await read_body(request, TraceRequest)
    agent, tracer = _tracer(request)
    try:
        state = tracer.set_mode(body.mode)
    except ValueError as e:
        raise QueryError(str(e)) from None
    return TraceBody(agent.rank, **state).to_wire()
