"""Core routes: health, info, ranks, query (JSON and Arrow), eval, backtrace."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from probe_protocol import routes
from probe_protocol.bodies import (
    BacktraceBody,
    EvalBody,
    EvalRequest,
    HealthBody,
    PostmortemNowBody,
    RanksBody,
)
from probe_protocol.query import ArrowBody, QueryBody, QueryRequest

from ...collectors import stacks
from ...errors import ForbiddenError
from ...store.readonly import too_large
from .bodies import openapi_body, read_body

if TYPE_CHECKING:
    from ..parts import AgentParts

router = APIRouter()
ARROW_STREAM = routes.ARROW_STREAM


def _streamed(parts: list[bytes], media_type: str, headers: dict[str, str]) -> Response:
    """Send ``parts`` in order, without joining them into one more copy of the result."""
    async def chunks() -> Any:  # an async iterator: no thread-pool hop per chunk
        for part in parts:
            yield part

    return StreamingResponse(chunks(), media_type=media_type, headers=headers)


def _charge(request: Request, nbytes: int) -> None:
    """Charge a reply's bytes to the serving budget before it is sent (budget.py)."""
    budget = getattr(_agent(request), "serve_budget", None)
    if budget is not None:
        budget.charge_bytes(nbytes)


def _agent(request: Request) -> AgentParts:
    return request.app.state.agent


_VIA = re.compile(routes.VIA_PATTERN)


def _client(request: Request) -> str:
    """Who sent ``request``, as the audit names it: ``IP:PORT`` or ``unix``, plus ``via NAME``
    when a program drove the CLI (routes.VIA_HEADER: ``via mcp`` for `probe mcp`)."""
    c = request.scope.get("client")
    # Over a unix socket, the watchdog proxies TCP clients through the agent's private
    # socket and says who they are; it strips this header from what clients send, and only our
    # uid or root can reach a unix socket (SO_PEERCRED), so the header cannot be forged remotely.
    who = f"{c[0]}:{c[1]}" if c else request.headers.get(routes.CLIENT_HEADER) or "unix"
    via = request.headers.get(routes.VIA_HEADER, "")
    return f"{who} via {via}" if via and _VIA.fullmatch(via) else who


@router.get(routes.HEALTH.path)
async def health(request: Request, challenge: str | None = None,
                 status: str | None = None) -> Any:
    """Open to anyone. With ``challenge``, an agent that has a token proves it for the address
    the client reached (probe_protocol.tokens.proof) before the client sends it the token.
    With ``status``: the rank's state for a scheduler. The watchdog answers that itself (it
    answers while the GIL is held); this is the agent without a watchdog."""
    agent = _agent(request)
    if status is not None:
        return _health_status(agent)
    server = request.scope.get("server")
    reached = (server[0], agent.tcp_port) if isinstance(server, tuple | list) and server[0] \
        and agent.tcp_port else None
    proof = agent.gate.policy.health_extra({"challenge": challenge or ""}, reached)
    return HealthBody(agent.rank, proof=proof.get("proof")).to_wire()


def _health_status(agent: Any) -> Any:
    from ...watchdog.health import STALL_S, http_status

    clock = agent.stepclock
    last = getattr(clock, "last_step_at", None)
    age = time.time() - last if last else None
    step = clock.current_step if clock.seen_step else None
    if step is None:
        state, reason = "starting", "no optimizer step yet"
    elif age is not None and age > STALL_S:
        state, reason = "hung", f"no optimizer step for {age:.0f} s (stall limit {STALL_S:.0f} s)"
    else:
        state, reason = "healthy", "stepping"
    body = HealthBody(agent.rank, status="ok" if http_status(state) == 200 else "unhealthy",
                      state=state, reason=reason, step=step,
                      step_age_s=round(age, 3) if age is not None else None, heartbeat_age_s=0.0,
                      pid=agent.identity.pid, host=agent.identity.host)
    return JSONResponse(body.to_wire(), status_code=http_status(state))


@router.post(routes.POSTMORTEM_NOW.path)
async def postmortem_now(request: Request) -> dict[str, Any]:
    """Write the post-mortem copy now (`probe health` asks every rank at once when one turns
    unhealthy, so the copies describe one moment); returns at once, the copy thread writes."""
    agent = _agent(request)
    pm = getattr(agent, "postmortem", None)
    if pm is None:
        return PostmortemNowBody(agent.rank, note="no post-mortem copy (PROBE_POSTMORTEM=off "
                                 "or it could not start)").to_wire()
    await asyncio.to_thread(pm.copy.refresh_soon, 0.0)
    return PostmortemNowBody(agent.rank, copy=pm.path, requested_at=time.time()).to_wire()


@router.get(routes.INFO.path)
async def info(request: Request) -> dict[str, Any]:
    return _agent(request).info().to_wire()


@router.get(routes.RANKS.path)
async def ranks(request: Request) -> dict[str, Any]:
    agent = _agent(request)
    registry = agent.collectors.ranks
    world = max(getattr(registry, "world_size", 0), agent.identity.world_size)
    discovery = registry.describe() if registry is not None else {"state": "off"}
    return RanksBody(agent.rank, tuple(agent.known_ranks()), world_size=world,
                     discovery=discovery).to_wire()


@router.post(routes.QUERY.path, response_model=None, openapi_extra=openapi_body(QueryRequest))
async def query(request: Request) -> Response:
    """Rows within PROBE_MAX_ROWS and PROBE_MAX_RESULT_BYTES; ``truncated_by`` names the cap
    that cut them. The SQL text is capped at PROBE_MAX_SQL_BYTES before it is parsed."""
    agent = _agent(request)
    body = await read_body(request, QueryRequest, "sql", agent.config.max_sql_bytes,
                           "PROBE_MAX_SQL_BYTES")
    loop = asyncio.get_running_loop()
    if ARROW_STREAM in request.headers.get("accept", ""):
        res = await loop.run_in_executor(
            agent.sql_pool, agent.store.query_arrow, body.sql, body.max_rows
        )
        _charge(request, res.nbytes)
        headers = ArrowBody(agent.rank, res.truncated, b"").headers(res.limit)
        return _streamed(res.parts, ARROW_STREAM, headers)
    res = await loop.run_in_executor(
        agent.sql_pool, lambda: agent.store.query_json(body.sql, max_rows=body.max_rows)
    )
    _charge(request, res.nbytes)
    # The rows arrive encoded (store/results.py): the body is written around them, never re-encoded.
    answer = QueryBody(agent.rank, tuple(res.columns), tuple(res.types), (), res.truncated,
                       round(res.elapsed_ms, 3), res.limit or None)
    parts = answer.stream(res.parts)
    return _streamed(parts, "application/json", {})


@router.post(routes.EVAL.path, openapi_extra=openapi_body(EvalRequest))
async def eval_code(request: Request) -> dict[str, Any]:
    """Code is capped at PROBE_MAX_EVAL_BYTES before it is compiled."""
    agent = _agent(request)
    body = await read_body(request, EvalRequest, "code", agent.config.max_eval_bytes,
                           "PROBE_MAX_EVAL_BYTES")
    if len(body.code.encode()) > agent.config.max_eval_bytes:
        raise too_large("code", len(body.code.encode()), agent.config.max_eval_bytes,
                        "PROBE_MAX_EVAL_BYTES")
    client = _client(request)
    # eval is remote code execution. Off loopback it needs a token; the unix socket is
    # already restricted to our uid (SO_PEERCRED), so it is always allowed.
    if client != "unix" and not agent.config.eval_allowed:
        agent.audit(client, body.code, "refused", "no token on a non-loopback bind", 0.0)
        raise ForbiddenError(
            f"eval refused: this agent listens on {agent.config.host} without a token. Set "
            "PROBE_TOKEN (or PROBE_TOKEN_FILE) in the training job's environment and pass "
            "--token to probe, or bind PROBE_HOST=127.0.0.1"
        )
    loop = asyncio.get_running_loop()
    out = await loop.run_in_executor(agent.eval_pool, agent.run_eval, body.code, client,
                                     body.id)
    return EvalBody(agent.rank, id=out.job.id if out.job else None, result=out.result,
                    stdout=out.stdout, stderr=out.stderr,
                    elapsed_ms=round(out.elapsed_ms, 3)).to_wire()


@router.get(routes.BACKTRACE.path)
async def backtrace(
    request: Request, locals: bool = False, native: bool = False, all: bool = False,
    secrets: bool = False,
) -> JSONResponse:
    agent = _agent(request)
    t0 = time.perf_counter()
    if locals:
        # Reprs run user code that may be slow; keep them off the event loop.
        snap = await asyncio.get_running_loop().run_in_executor(
            agent.query_pool, lambda: stacks.snapshot(
                with_locals=True, include_agent=all, show_secrets=secrets)
        )
    else:
        snap = stacks.snapshot(include_agent=all)
    return JSONResponse(BacktraceBody(  # plain strings and numbers: no jsonable_encoder pass
        agent.rank,
        pid=agent.identity.pid,
        host=agent.identity.host,
        source="in-process",
        route="sys._current_frames",
        native=False,
        python=sys.version.split()[0],
        threads=tuple(stacks.to_dicts(snap)),
        elapsed_ms=round((time.perf_counter() - t0) * 1e3, 3),
    ).to_wire())
