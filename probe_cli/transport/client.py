"""ProbeClient: one agent, one method per route of docs/http-api.md.

Every method returns the decoded wire body (a dict with ``ok`` and ``rank``) or raises a
``RankError`` subclass whose message names the agent's URL and whose help says what to do.
httpx exceptions never escape this module; failures.py says what each one means.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
from typing import Any

import httpx

from probe_protocol import routes
from probe_protocol.actions import ActionRequest, FlameRequest, ResumeRequest
from probe_protocol.bodies import EvalRequest, NumericsRequest, TraceRequest
from probe_protocol.query import ArrowBody, CannedRequest, QueryRequest
from probe_protocol.routes import Route

from ..errors import AgentHTTPError, AgentUnreachableError, ProtocolError, UsageProblemError
from .failures import decode_body, http_error, protocol_error, transport_error
from .guard import Dialled, install
from .targets import Endpoint
from .trust import check_agent
from .untrusted_text import escape_body

ARROW_STREAM = routes.ARROW_STREAM

# Without TCP_NODELAY a POST whose body goes out in a second segment waits for the agent's
# delayed ACK: a 44-48 ms floor per request measured on these machines
# (docs/decisions/cli-and-transport.md, "Fan-out at scale").
_TCP_OPTIONS = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]

_ssl_contexts: dict[str | None, ssl.SSLContext] = {}


def ssl_context(cacert: str | None = None) -> ssl.SSLContext:
    """One verifying SSL context per CA file for every client. Building one loads the CA bundle
    (≈24 ms here); a fresh one per rank made a 64-rank fan-out take 2 s instead of ~0.2 s.
    ``cacert`` (a PEM bundle) replaces the system's trust store."""
    ctx = _ssl_contexts.get(cacert)
    if ctx is None:
        if cacert is None:
            ctx = httpx.create_ssl_context()
        else:
            try:
                ctx = ssl.create_default_context(cafile=cacert)
            except (OSError, ssl.SSLError) as e:
                raise UsageProblemError(
                    f"cannot use --cacert {cacert}: {getattr(e, 'strerror', None) or e}",
                    help_text="give the PEM file of the CA that signed the agents' "
                              "PROBE_TLS_CERT",
                ) from None
        _ssl_contexts[cacert] = ctx
    return ctx


class ProbeClient:
    """A connection (keep-alive) to one agent.

    Args:
        endpoint: where the agent listens; a unix-socket endpoint connects through
            ``httpx.HTTPTransport(uds=...)`` with base URL ``http://localhost``.
        token: sent as ``Authorization: Bearer <token>``; None sends no header (an agent with
            PROBE_TOKEN set then answers 401).
        timeout: seconds for each of connect, write and read; a rank slower than this is
            reported as silent.
        cacert: PEM CA bundle that https agents' certificates must chain to (``--cacert``);
            None trusts the system's store.
        raw: keep control characters in the agent's strings (``--raw``); by default they are
            escaped as they are decoded (untrusted_text.py).
    """

    def __init__(self, endpoint: Endpoint, *, token: str | None = None, timeout: float = 5.0,
                 cacert: str | None = None, raw: bool = False):
        self.endpoint = endpoint
        self.raw = raw
        self.timeout = timeout
        verify = ssl_context(cacert)
        if endpoint.uds:
            transport = httpx.HTTPTransport(uds=endpoint.uds, verify=verify)
        else:
            transport = httpx.HTTPTransport(socket_options=_TCP_OPTIONS, verify=verify)
        # Every connection is owner-checked before its first byte (guard.py).
        self._dialled = Dialled()
        install(transport, endpoint.label, self._dialled, endpoint.this_machine_only)
        self.token = token
        self.cacert = cacert
        # Sent per request, and only once trust.check_agent has vouched for the agent.
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._trusted = False
        self._http = httpx.Client(
            base_url=endpoint.base_url,
            headers=via_headers(),
            transport=transport,
            timeout=httpx.Timeout(timeout),
            trust_env=False,  # an operator's HTTP(S)_PROXY must not swallow loopback agents
        )

    def __enter__(self) -> ProbeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- routes -------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """Open to anyone: sent without the token and without the trust check."""
        body = self._decode(self._send(routes.HEALTH, anonymous=True))
        if body is None:
            raise ProtocolError(f"{self.endpoint.label} answered /v1/health with no probe body",
                                url=self.endpoint.label, reason="not a probe answer")
        return body

    def health_status(self, stall: float | None = None) -> dict[str, Any]:
        """``/v1/health?status``: the rank's state for a scheduler (healthy, starting, hung,
        dead), answered 503 for hung and dead: that answer is the body, not a failure."""
        params: dict[str, Any] = {"status": "1"}
        if stall:
            params["stall"] = stall
        try:
            return self._decode(self._send(routes.HEALTH, params=params, anonymous=True)) or {}
        except AgentHTTPError as e:
            if e.status == 503 and isinstance(e.body, dict) and e.body.get("state"):
                return e.body
            raise

    def postmortem_now(self) -> dict[str, Any]:
        """Ask the rank to write its post-mortem copy now (every rank at once: the copies
        then describe one moment)."""
        return self._json(routes.POSTMORTEM_NOW)

    def info(self) -> dict[str, Any]:
        return self._json(routes.INFO)

    def ranks(self) -> dict[str, Any]:
        return self._json(routes.RANKS)

    def query(self, sql: str, max_rows: int | None = None) -> dict[str, Any]:
        return self._json(routes.QUERY, json=QueryRequest(sql, max_rows).to_wire())

    def node_fanout(self, request: dict[str, Any]) -> dict[str, Any]:
        """One node's ranks at once, merged (probe_protocol/nodefan.py builds ``request``)."""
        return self._json(routes.NODE_FANOUT, json=request)

    def query_arrow(self, sql: str, max_rows: int | None = None) -> dict[str, Any]:
        """The result as an Arrow IPC stream: ``{"ok", "rank", "truncated", "arrow": bytes}``
        (``wire.ArrowBody``)."""
        resp = self._send(routes.QUERY, json=QueryRequest(sql, max_rows).to_wire(),
                          headers={"Accept": ARROW_STREAM})
        if not resp.headers.get("content-type", "").startswith(ARROW_STREAM):
            raise protocol_error(resp, self.endpoint.label, "an Arrow stream")
        return ArrowBody.from_headers(resp.headers, resp.content).to_wire()

    def canned(self, name: str, **params: Any) -> dict[str, Any]:
        """A canned query of sql/queries/ by name; the body is a ``query`` body."""
        return self._json(routes.CANNED_QUERY, json=CannedRequest(params).to_wire(), name=name)

    def queries(self) -> dict[str, Any]:
        return self._json(routes.QUERIES)

    def eval(self, code: str, eval_id: str | None = None) -> dict[str, Any]:
        return self._json(routes.EVAL, json=EvalRequest(code, eval_id).to_wire())

    def cancel_eval(self, eval_id: str) -> dict[str, Any]:
        """Cancel a running eval; answers once it stopped, or after about a second with
        ``still_running``."""
        return self._json(routes.CANCEL_EVAL, eval_id=eval_id)

    def backtrace(
        self, *, locals: bool = False, native: bool = False, all: bool = False,
        secrets: bool = False, children: bool = False,
    ) -> dict[str, Any]:
        params = {"locals": int(locals), "native": int(native), "all": int(all)}
        if secrets:
            params["secrets"] = 1
        if children:  # the rank's child processes, read by its watchdog
            params["children"] = 1
        return self._json(routes.BACKTRACE, params=params)

    def collectives(self, *, limit: int = 200, state: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if state is not None:
            params["state"] = state
        return self._json(routes.COLLECTIVES, params=params)

    def trace(self) -> dict[str, Any]:
        return self._json(routes.TRACE)

    def set_trace(self, mode: str) -> dict[str, Any]:
        """``mode``: ``on``, ``off`` or ``every:N``; applies from the next optimizer step."""
        return self._json(routes.SET_TRACE, json=TraceRequest(mode).to_wire())

    def doctor(self) -> dict[str, Any]:
        return self._json(routes.DOCTOR)

    def memory_tensors(self, top: int) -> dict[str, Any]:
        return self._json(routes.MEMORY_TENSORS, params={"top": top})

    def memory_snapshot(self, ahead: int, *, wait: float = 60.0) -> dict[str, Any]:
        """Record the CUDA allocator's history for the next ``ahead`` steps; returns ``{"ok",
        "rank", "content" (the pickle's bytes), "bytes", "steps"}`` (the command writes it)."""
        timeout = httpx.Timeout(self.timeout, read=wait + self.timeout)
        resp = self._send(routes.MEMORY_SNAPSHOT, params={"ahead": ahead, "wait": wait},
                          timeout=timeout)
        if not resp.headers.get("content-type", "").startswith("application/octet-stream"):
            raise protocol_error(resp, self.endpoint.label, "a snapshot pickle")
        rank = ArrowBody.from_headers(resp.headers, b"").rank
        return {"ok": True, "rank": rank, "content": resp.content, "bytes": len(resp.content),
                "steps": resp.headers.get(routes.STEPS_HEADER)}

    def numerics(self) -> dict[str, Any]:
        return self._json(routes.NUMERICS)

    def set_numerics(self, thresholds: dict[str, float]) -> dict[str, Any]:
        return self._json(routes.SET_NUMERICS, json=NumericsRequest(thresholds).to_wire())

    def doctor_grads(self, wait: float) -> dict[str, Any]:
        return self._json(routes.DOCTOR_GRADS, params={"wait": wait})

    def step(self) -> dict[str, Any]:
        return self._json(routes.STEP)

    def submit_action(self, request: ActionRequest) -> dict[str, Any]:
        """Queue a step-boundary action (id and step included)."""
        return self._json(routes.SUBMIT_ACTION, json=request.to_wire())

    def actions(self) -> dict[str, Any]:
        return self._json(routes.ACTIONS)

    def action(self, action_id: str, *, wait: float | None = None) -> dict[str, Any]:
        """One action; with ``wait``, the agent answers once it has finished or after that
        many seconds (a long poll)."""
        params = None if wait is None else {"wait": wait}
        return self._json(routes.ACTION, params=params, action_id=action_id)

    def cancel_action(self, action_id: str) -> dict[str, Any]:
        return self._json(routes.CANCEL_ACTION, action_id=action_id)

    def resume(self, requested_by: str) -> dict[str, Any]:
        return self._json(routes.RESUME, json=ResumeRequest(requested_by).to_wire())

    # profile windows (queued with submit_action, kind "profile") and flame graphs
    def profile(self, profile_id: str, *, wait: float | None = None) -> dict[str, Any]:
        """One rank's profile window (state, step spans, top operators, cost); ``wait`` long-
        polls until it is done."""
        params = None if wait is None else {"wait": wait}
        return self._json(routes.PROFILE, params=params, profile_id=profile_id)

    def profile_trace(self, profile_id: str, dest: str, *, read_timeout: float = 120.0
                      ) -> dict[str, Any]:
        """Stream the window's Chrome trace into the file ``dest`` (1 MiB at a time: memory
        stays flat whatever the size); returns ``{"ok", "rank", "path", "bytes"}``."""
        timeout = httpx.Timeout(self.timeout, read=max(self.timeout, read_timeout))
        resp = self._send(routes.PROFILE_TRACE, stream=True, timeout=timeout,
                          profile_id=profile_id)
        n = 0
        try:
            with open(dest, "wb") as f:
                for chunk in resp.iter_bytes(1 << 20):
                    f.write(chunk)
                    n += len(chunk)
        except httpx.HTTPError as e:
            raise AgentUnreachableError(
                f"the trace from {self.endpoint.label} broke off after {n} bytes: {e}",
                url=self.endpoint.label, reason=f"trace cut at {n} bytes") from e
        finally:
            resp.close()
        rank = ArrowBody.from_headers(resp.headers, b"").rank
        return {"ok": True, "rank": rank, "path": dest, "bytes": n}

    def start_flame(self, request: FlameRequest) -> dict[str, Any]:
        """Start sampling Python stacks."""
        return self._json(routes.START_FLAME, json=request.to_wire())

    def flame(self, flame_id: str, *, wait: float | None = None) -> dict[str, Any]:
        params = None if wait is None else {"wait": wait}
        return self._json(routes.FLAME, params=params, flame_id=flame_id)

    # -- generic ------------------------------------------------------------------------------

    def _json(
        self,
        route: Route,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        **path_params: Any,
    ) -> dict[str, Any]:
        """One JSON route, its path filled in from ``path_params``. Private: a route the CLI
        uses gets a method above, so that no command names a route."""
        resp = self._send(route, json=json, params=params, **path_params)
        body = self._decode(resp)
        if body is None:
            raise protocol_error(resp, self.endpoint.label, "a JSON body")
        return body

    def _decode(self, resp: httpx.Response) -> dict[str, Any] | None:
        body = decode_body(resp)
        return body if self.raw or body is None else escape_body(body)

    def _ensure_trusted(self) -> None:
        """Once per client: no token and no code before the agent is shown to be the job's
        (trust.py). Raises UntrustedAgentError."""
        if self._trusted:
            return

        def health(params: dict[str, Any]) -> dict[str, Any]:
            return self._decode(self._send(routes.HEALTH, params=params,
                                           anonymous=True)) or {}

        check_agent(self.endpoint, token=self.token, cacert=self.cacert, health=health,
                    dialled=self._dialled)
        self._trusted = True

    def _send(self, route: Route, *, anonymous: bool = False, stream: bool = False,
              json: Any = None, params: dict[str, Any] | None = None,
              headers: dict[str, str] | None = None, timeout: Any = None,
              **path_params: Any) -> httpx.Response:
        method, path = route.method, route.url(**path_params)
        kw: dict[str, Any] = {"json": json, "params": params, "headers": headers}
        if timeout is not None:
            kw["timeout"] = timeout
        if not anonymous:
            self._ensure_trusted()
            if self._auth:
                kw["headers"] = {**self._auth, **(kw.get("headers") or {})}
        try:
            if stream:  # the body is read by the caller, chunk by chunk (profile traces)
                resp = self._http.send(self._http.build_request(method, path, **kw), stream=True)
            else:
                resp = self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise transport_error(e, self.endpoint, self.timeout) from e
        if resp.status_code >= 400:
            if stream:
                resp.read()
                resp.close()
            raise http_error(resp, self.endpoint.label, self._decode(resp))
        return resp


def via() -> str | None:
    """What drives this CLI, from PROBE_VIA (``mcp`` when `probe mcp` runs it), if it is a
    name the agent accepts (routes.VIA_PATTERN); None otherwise."""
    name = os.environ.get("PROBE_VIA", "")
    return name if name and re.fullmatch(routes.VIA_PATTERN, name) else None


def via_headers() -> dict[str, str]:
    name = via()
    return {routes.VIA_HEADER: name} if name else {}
