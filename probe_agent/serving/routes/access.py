"""The watchdog's report of the requests it refused, so that one audit table and one
counter (`probe info`, python.audit with kind 'access') cover every public socket.
Each report is applied once, whatever the resends (watchdog/refusal_report.py)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request

from probe_protocol import routes
from probe_protocol.bodies import RecordedBody, RefusalReport

from ...errors import ForbiddenError
from .bodies import read_body

router = APIRouter()


@router.post(routes.ACCESS_REFUSALS.path, include_in_schema=False)
async def report_refusals(request: Request) -> dict[str, Any]:
    body = await read_body(request, RefusalReport, text_cap=2 * 1024 * 1024)
    agent = request.app.state.agent
    # The watchdog sends these itself (x-probe-client: watchdog) over the private socket; it
    # strips that header from what clients send, so a token holder cannot forge audit rows.
    if agent.gate.peer_of(request.scope).kind != "unix" or \
            request.headers.get(routes.CLIENT_HEADER) != "watchdog":
        raise ForbiddenError("only the rank's watchdog reports refusals")
    applied = agent.refusals.apply_report(
        body.id, [(r["client"], r["what"], r["reason"], r["message"]) for r in body.refusals],
        body.unlisted, time.time())
    return RecordedBody(agent.rank, len(body.refusals) if applied else 0).to_wire()
