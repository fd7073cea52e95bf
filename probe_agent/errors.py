"""Errors raised inside the agent, each carrying the HTTP status it maps to.

One exception handler in ``serving/app.py`` turns any of these into the wire error body
(datasette's ``Base400`` style: the status lives on the class)::

    ProbeAgentError (500)
    ├── ConfigError            bad PROBE_* variable; raised by start(), never over HTTP
    ├── AgentStateError        start() twice, stop() of nothing
    ├── BindError              port in use / not permitted; raised by start()
    ├── QueryError (400)       bad SQL, a statement that is not a read
    │   └── QueryTimeoutError (408)   PROBE_QUERY_TIMEOUT_MS elapsed
    ├── EvalError (400)        the code raised or did not compile
    ├── TooLargeError (413)    SQL or eval code over its size cap
    ├── AuthError (401)        missing or wrong bearer token
    ├── ForbiddenError (403)   refused by policy (eval without a token off loopback, peer uid)
    ├── NotFoundError (404)    unknown rank, action, route
    └── ConflictError (409)    a step-boundary action that cannot be queued now (no optimizer
                               step seen, target step already passed, already running)
"""

from __future__ import annotations


class ProbeAgentError(Exception):
    """Base class; an unexpected agent failure (HTTP 500)."""

    status = 500

    def __init__(self, message: str, **extra: object) -> None:
        super().__init__(message)
        self.message = message
        #: Extra keys merged into the wire error body (e.g. eval's traceback).
        self.extra = extra


class ConfigError(ProbeAgentError, ValueError):
    status = 400


class AgentStateError(ProbeAgentError, RuntimeError):
    status = 409


class BindError(ProbeAgentError, OSError):
    status = 500


class QueryError(ProbeAgentError):
    status = 400


class QueryTimeoutError(QueryError):
    status = 408


class EvalError(ProbeAgentError):
    status = 400


class TooLargeError(ProbeAgentError):
    """A request over a size cap (PROBE_MAX_SQL_BYTES, PROBE_MAX_EVAL_BYTES): refused before
    it is parsed."""

    status = 413


class AuthError(ProbeAgentError):
    status = 401


class ForbiddenError(ProbeAgentError):
    status = 403


class NotFoundError(ProbeAgentError):
    status = 404


class ConflictError(ProbeAgentError):
    status = 409
