"""Every route of the agent's HTTP API (docs/http-api.md), as one table.

The agent's routers register ``route.path`` (a FastAPI path template), the watchdog's proxy
compares request paths against it, and the CLI's client builds URLs with ``route.url(...)``. A
route added here and not served, served and not listed, or not documented fails
tests/integration/test_wire_contract.py and tests/unit/test_docs.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

#: Every route lives under this prefix.
PREFIX = "/v1"


@dataclass(frozen=True, slots=True)
class Route:
    """One route: ``method`` and ``path`` (``{name}`` marks a path parameter)."""

    method: str
    path: str
    purpose: str

    def url(self, **params: object) -> str:
        """The path with its parameters filled in (each quoted: an id is never a path)."""
        return self.path.format(**{k: quote(str(v), safe="") for k, v in params.items()})

    @property
    def key(self) -> str:
        """``METHOD /path``, as docs/http-api.md writes it."""
        return f"{self.method} {self.path}"

    def matches(self, method: str, path: str) -> bool:
        """True for a request to this route (exact routes only: no parameters)."""
        return method == self.method and path == self.path


def _r(method: str, path: str, purpose: str) -> Route:
    return Route(method, PREFIX + path, purpose)


HEALTH = _r("GET", "/health", "liveness, open to anyone; with ?challenge, the token proof")
INFO = _r("GET", "/info", "who the rank is: pid, host, versions, addresses, access, watchdog")
RANKS = _r("GET", "/ranks", "every rank this agent knows, for fan-out")
QUERY = _r("POST", "/query", "one read-only SQL statement (JSON, or Arrow with Accept)")
EVAL = _r("POST", "/eval", "run Python in the rank now")
EVALS = _r("GET", "/evals", "running and recently finished evals")
EVAL_JOB = _r("GET", "/evals/{eval_id}", "one eval; ?wait= long-polls until it ended")
CANCEL_EVAL = _r("DELETE", "/evals/{eval_id}", "cancel a running eval: every further line raises")
BACKTRACE = _r("GET", "/backtrace", "every thread's stack (from the watchdog when the GIL is held)")
COLLECTIVES = _r("GET", "/collectives", "recent collectives of this rank and the agent's clock")
QUERIES = _r("GET", "/queries", "the canned diagnostics of sql/queries/")
CANNED_QUERY = _r("POST", "/queries/{name}", "run one canned query by name")
TRACE = _r("GET", "/trace", "the torch tracing mode and what the tracer has done")
SET_TRACE = _r("POST", "/trace", "change the tracing mode from the next step boundary")
DOCTOR = _r("GET", "/doctor", "training-loop state for `probe doctor`, no user code")
DOCTOR_GRADS = _r("POST", "/doctor/grads", "check every gradient after the next optimizer step")
NUMERICS = _r("GET", "/numerics", "the loss and gradient checks' state, thresholds and guard")
SET_NUMERICS = _r("POST", "/numerics", "change the numerics thresholds while the job runs")
STEP = _r("GET", "/step", "this rank's step clock")
ACTIONS = _r("GET", "/actions", "queued, running and recently finished actions")
SUBMIT_ACTION = _r("POST", "/actions", "queue a step-boundary action")
ACTION = _r("GET", "/actions/{action_id}", "one action; ?wait= long-polls until it finished")
CANCEL_ACTION = _r("DELETE", "/actions/{action_id}", "cancel a queued action")
RESUME = _r("POST", "/resume", "release a paused training thread")
PROFILE = _r("GET", "/profile/{profile_id}", "one profile window; ?wait= long-polls")
PROFILE_TRACE = _r("GET", "/profile/{profile_id}/trace", "the window's Chrome trace, streamed")
START_FLAME = _r("POST", "/flame", "start sampling this rank's Python stacks")
FLAME = _r("GET", "/flame/{flame_id}", "a flame session; ?wait= long-polls")
MEMORY_TENSORS = _r("GET", "/memory/tensors", "live tensors by device, dtype and shape")
MEMORY_SNAPSHOT = _r("POST", "/memory/snapshot",
                     "the CUDA allocator's history over the next N steps (memory_viz pickle)")
METRICS = _r("GET", "/metrics", "Prometheus text exposition of this rank's live numbers")
POSTMORTEM_NOW = _r("POST", "/postmortem", "write this rank's post-mortem copy now")
ACCESS_REFUSALS = _r("POST", "/access/refusals",
                     "the watchdog reports the requests it refused (private socket only)")

#: Every route, in the order docs/http-api.md lists them.
ROUTES: tuple[Route, ...] = (
    HEALTH, INFO, RANKS, QUERY, EVAL, EVALS, EVAL_JOB, CANCEL_EVAL, BACKTRACE, COLLECTIVES,
    QUERIES, CANNED_QUERY, TRACE, SET_TRACE, DOCTOR, DOCTOR_GRADS, NUMERICS, SET_NUMERICS, STEP,
    ACTIONS, SUBMIT_ACTION, ACTION, CANCEL_ACTION, RESUME,
    PROFILE, PROFILE_TRACE, START_FLAME, FLAME, MEMORY_TENSORS, MEMORY_SNAPSHOT, METRICS,
    POSTMORTEM_NOW, ACCESS_REFUSALS,
)

#: Served by the watchdog only (not by the agent's app): one rank per node asks the node's
#: other ranks over their unix sockets and merges the answers (probe_protocol/nodefan.py).
NODE_FANOUT = _r("POST", "/node/fanout",
                 "ask this node's ranks (backtrace or query) and answer once, merged")
WATCHDOG_ROUTES: tuple[Route, ...] = (NODE_FANOUT,)

# -- headers ----------------------------------------------------------------------------------
#: Which rank answered, on the answers that are not a JSON body (Arrow, a trace file, a pickle).
RANK_HEADER = "X-Probe-Rank"
#: How long a request waited for the serving budget (PROBE_SERVE_CPU), when it waited at all.
QUEUED_HEADER = "X-Probe-Queued-Ms"
#: The steps a memory snapshot covers, ``first-last``.
STEPS_HEADER = "X-Probe-Steps"
#: Set by the watchdog on what it forwards to the agent's private socket: the TCP client it
#: proxies (``IP:PORT``), or ``watchdog`` for its own requests. Dropped from what clients send.
CLIENT_HEADER = "x-probe-client"
#: Sent by the CLI when another program drives it (``probe mcp`` sets PROBE_VIA=mcp for the CLI
#: runs it makes): the agent adds it to the client it audits ("127.0.0.1:5123 via mcp"). A label
#: for the audit, not a credential: the access rule never reads it.
VIA_HEADER = "x-probe-via"
#: What a VIA_HEADER may say (anything else is ignored): a short lower-case name.
VIA_PATTERN = r"[a-z][a-z0-9-]{0,15}"

#: The Arrow IPC stream media type a query answers in when the request accepts it.
ARROW_STREAM = "application/vnd.apache.arrow.stream"
