"""create_app(agent) -> FastAPI: authentication, the error contract, and the feature routers.

Routes live in ``probe_agent/serving/routes/<feature>.py``, each an ``APIRouter`` listed in
``ROUTERS`` (imported by name: a route module missing from a build is an ImportError at start,
not a silent 404); they reach the agent through ``request.app.state.agent``. Routes translate HTTP
to and from the store, the evaluator and the collectors, and nothing more.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from probe_protocol import routes
from probe_protocol.envelope import error_body

from .._version import __version__
from ..access import SCOPE_KEYS, header_map, reserve_refusal
from ..errors import ProbeAgentError
from .routes import (
    access,
    actions,
    cluster,
    core,
    doctor,
    evals,
    memory,
    metrics,
    profile,
    trace,
)

if TYPE_CHECKING:
    from .budget import ServeBudget
    from .parts import AgentParts

log = logging.getLogger(__name__)

_QUEUED = routes.QUEUED_HEADER.lower().encode()
#: Cheap GETs that skip the serving budget (serving/budget.py).
_UNBUDGETED = frozenset({routes.HEALTH.path, routes.STEP.path, routes.BACKTRACE.path})

#: Feature routers, in the order they are mounted. Each module exposes ``router``.
ROUTERS = (core, trace, cluster, actions, evals, doctor, access, profile, metrics,
           memory)


class AdmissionMiddleware:
    """Pure ASGI middleware (Starlette's ``BaseHTTPMiddleware`` costs a task group and a
    memory stream per request): the access rule (access.py: owner or token, Host and Origin;
    refusals are audited), the serving CPU budget (serving/budget.py),
    and a JSON 500 for a route's bug, so that a bug never disturbs training."""

    def __init__(self, app: Any, agent: AgentParts, budget: ServeBudget) -> None:
        self.app = app
        self.agent = agent
        self.budget = budget

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rank = self.agent.rank
        gate = self.agent.gate
        peer = gate.peer_of(scope)
        method, path = scope.get("method", ""), scope.get("path", "")
        busy = reserve_refusal(scope.get(SCOPE_KEYS), method, path)
        if busy is not None:
            reply = JSONResponse(error_body(rank, 503, busy), status_code=503)
            await reply(scope, receive, send)
            return
        refusal = gate.policy.check(peer, method, path, header_map(scope.get("headers") or []))
        if refusal is not None:
            self.agent.audit_refusal(peer.label(), scope.get("method", ""),
                                     scope.get("path", ""), refusal)
            reply = JSONResponse(error_body(rank, refusal.status, refusal.message),
                                 status_code=refusal.status, headers=dict(refusal.headers))
            await reply(scope, receive, send)
            return
        # Liveness, the step clock and the plain backtrace stay instant: they are what an
        # on-call engineer needs when something is wrong, and must not queue behind a crowd of
        # dashboards (0.3-0.7 ms each). A queued backtrace would also make the watchdog fall
        # back to py-spy, which pauses the process to read it. Locals run user reprs: budgeted.
        exempt = (scope.get("method") == "GET" and scope.get("path") in _UNBUDGETED
                  and b"locals" not in scope.get("query_string", b""))
        waited = 0.0 if exempt else await self.budget.admit()
        started = False

        async def send_with_wait(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if waited >= 0.001:
                    message.setdefault("headers", [])
                    message["headers"] = [*message["headers"],
                                          (_QUEUED, f"{waited * 1e3:.0f}".encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_wait)
        except Exception as e:  # a bug in a route: answer 500, never disturb training
            if _stopping(e) and not started:
                # The process is exiting (a crash, the end of training) while a request was in
                # flight: the agent's pools are shut. Not a bug, and the job's stderr is the
                # user's: a 503, no traceback (one printed beside a user's own crash).
                reply = JSONResponse(error_body(rank, 503, "the agent is stopping (the process "
                                                "is exiting)"), status_code=503)
                await reply(scope, receive, send)
                return
            log.exception("probe agent: unexpected error on %s", scope.get("path"))
            if started:
                raise
            reply = JSONResponse(
                error_body(rank, 500, f"internal agent error: {type(e).__name__}: {e}"),
                status_code=500,
            )
            await reply(scope, receive, send)
        finally:
            if not exempt:
                self.budget.done()


def _stopping(e: Exception) -> bool:
    """concurrent.futures' error for work submitted to a pool that was shut down."""
    return isinstance(e, RuntimeError) and "after shutdown" in str(e)


def create_app(agent: AgentParts) -> FastAPI:
    app = FastAPI(
        title="probe agent",
        version=__version__,
        description="Live query, eval and backtrace of one training rank. See docs/http-api.md.",
    )
    app.state.agent = agent
    rank = agent.rank

    from .budget import ServeBudget

    agent.serve_budget = ServeBudget(agent.config.serve_cpu)
    app.add_middleware(AdmissionMiddleware, agent=agent, budget=agent.serve_budget)

    @app.exception_handler(ProbeAgentError)
    async def probe_error(_: Request, exc: ProbeAgentError) -> JSONResponse:
        return JSONResponse(
            error_body(rank, exc.status, exc.message, **exc.extra), status_code=exc.status
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}; see /docs for the API"
        return JSONResponse(error_body(rank, exc.status_code, message), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
            parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
        return JSONResponse(
            error_body(rank, 422, "malformed request: " + "; ".join(parts)), status_code=422
        )

    for module in ROUTERS:
        app.include_router(module.router)
    return app
