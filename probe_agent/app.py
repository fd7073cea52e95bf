"""create_app(agent) -> FastAPI: authentication, the error contract, and the feature routers.

Routes live in ``probe_agent/routes/<feature>.py``, each an ``APIRouter`` listed in ``ROUTERS``;
they reach the agent through ``request.app.state.agent``. Routes translate HTTP to and from the
store, the evaluator and the collectors, and nothing more.
"""

from __future__ import annotations

import hmac
import importlib
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import ProbeAgentError

log = logging.getLogger(__name__)

#: Feature routers, by module under probe_agent.routes. Each module exposes ``router``.
ROUTERS = ("core", "trace", "cluster", "actions", "doctor")


def error_body(rank: int, status: int, message: str, **extra: Any) -> dict[str, Any]:
    """The wire error contract. Four keys are always present:

    - ``ok``: always False;
    - ``rank``: the answering rank;
    - ``status``: the HTTP status, repeated for clients that only see the body;
    - ``error``: one line saying what went wrong and, where we know, what to do.
    """
    return {"ok": False, "rank": rank, "status": status, "error": message, **extra}


def create_app(agent: Any) -> FastAPI:
    from . import __version__

    app = FastAPI(
        title="probe agent",
        version=__version__,
        description="Live query, eval and backtrace of one training rank. See docs/http-api.md.",
    )
    app.state.agent = agent
    rank = agent.rank

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        token = agent.config.token
        if token is not None:
            sent = request.headers.get("authorization", "")
            expected = f"Bearer {token}"
            # Constant time: the comparison must not leak how much of the token matched.
            if not hmac.compare_digest(sent.encode(), expected.encode()):
                why = "missing" if not sent else "wrong"
                return JSONResponse(
                    error_body(
                        rank, 401,
                        f"{why} token: pass --token or set PROBE_TOKEN to the job's token",
                    ),
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        try:
            return await call_next(request)
        except Exception as e:  # a bug in a route: answer 500, never disturb training
            log.exception("probe agent: unexpected error on %s", request.url.path)
            return JSONResponse(
                error_body(rank, 500, f"internal agent error: {type(e).__name__}: {e}"),
                status_code=500,
            )

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

    for name in ROUTERS:
        try:
            module = importlib.import_module(f".routes.{name}", __package__)
        except ModuleNotFoundError as e:
            if e.name == f"{__package__}.routes.{name}":
                continue  # that feature is not part of this build
            raise
        app.include_router(module.router)
    return app
