"""Why a request to one agent failed, as a ``RankError`` that names the agent and says what to do.

Three kinds of failure reach the CLI: httpx could not get an answer (timeout, refused, TLS
mismatch, a closed connection), the agent answered with an HTTP error (its JSON error body), or
something answered that is not a probe agent. Each becomes the ``errors.py`` class the exit
codes and the fan-out summary key on, with a short ``reason`` for the per-rank line.

Separate from client.py, which maps routes to requests: the diagnosis here reads OS errors and
TLS causes underneath httpx, and is the same whichever route failed.
"""

from __future__ import annotations

import json
import socket
import ssl
from typing import Any

import httpx

from ..errors import (
    AgentTimeoutError,
    AgentUnreachableError,
    ProtocolError,
    RankError,
    http_error_class,
)
from .targets import Endpoint
from .untrusted_text import escape_controls


def decode_body(resp: httpx.Response) -> dict[str, Any] | None:
    """The body as a probe wire dict, or None when it is not one."""
    try:
        body = resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) and "ok" in body else None


def transport_error(e: httpx.TransportError, endpoint: Endpoint, timeout: float) -> RankError:
    """No answer from the agent at ``endpoint`` (``timeout``: the client's, for the message)."""
    url = endpoint.label
    if isinstance(e, httpx.TimeoutException):
        return AgentTimeoutError(
            f"agent at {url} did not answer within {timeout:g} s",
            url=url,
            reason=f"timeout {timeout:g} s",
        )
    if isinstance(e, httpx.ConnectError | httpx.RemoteProtocolError | httpx.ReadError):
        why = _connect_reason(e)
        return AgentUnreachableError(
            f"cannot reach agent at {url}: {why}.", url=url, reason=why,
            help_text=_tls_advice(e, endpoint),
        )
    return AgentUnreachableError(
        f"cannot reach agent at {url}: {e}", url=url, reason=type(e).__name__
    )


def http_error(resp: httpx.Response, url: str, body: dict[str, Any] | None) -> RankError:
    """The agent at ``url`` answered HTTP 4xx/5xx; ``body`` is its decoded answer (None when it
    was no probe body, which makes it a ProtocolError)."""
    if body is None:
        return protocol_error(resp, url, "a probe error body")
    status = resp.status_code
    error = str(body.get("error") or escape_controls(resp.reason_phrase))
    cls = http_error_class(status)
    return cls(
        f"agent at {url} answered HTTP {status}: {error}",
        url=url,
        reason=f"HTTP {status}: {error}",
        status=status,
        body=body,
    )


def protocol_error(resp: httpx.Response, url: str, wanted: str) -> ProtocolError:
    """``url`` answered, but not with ``wanted`` (a JSON body, an Arrow stream, ...)."""
    kind = escape_controls(resp.headers.get("content-type", "no content type"))
    return ProtocolError(
        f"{url} answered HTTP {resp.status_code} ({kind}) instead of {wanted}",
        url=url,
        reason=f"not a probe answer (HTTP {resp.status_code}, {kind})",
    )


def _tls_advice(e: Exception, endpoint: Endpoint) -> str | None:
    """What to do when the failure looks like a TLS mismatch; None when it does not."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return ("the agent's certificate is not trusted: pass --cacert CA.pem (the CA that "
                    "signed its PROBE_TLS_CERT), or fix the certificate's host names")
        if isinstance(cause, ssl.SSLError):
            return ("TLS failed: if the agent has no PROBE_TLS_CERT it speaks plain HTTP; "
                    "use http://HOST:PORT and drop --cacert")
        cause = cause.__cause__ or cause.__context__
    if endpoint.base_url.startswith("http://") and not endpoint.uds and isinstance(
        e, httpx.RemoteProtocolError | httpx.ReadError
    ):
        return ("an agent started with PROBE_TLS_CERT speaks HTTPS: use https://HOST:PORT, or "
                "--cacert CA.pem (HOST:PORT targets then use https)")
    return None


def _connect_reason(e: Exception) -> str:
    """A few words for why a connection failed, from the OS error underneath httpx."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"TLS certificate not trusted ({cause.verify_message})"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, FileNotFoundError):
            return "no such socket"
        if isinstance(cause, socket.gaierror):
            return "unknown host"
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror.lower()
        cause = cause.__cause__ or cause.__context__
    text = str(e) or type(e).__name__
    if "refused" in text.lower():
        return "connection refused"
    if isinstance(e, httpx.RemoteProtocolError | httpx.ReadError):
        return f"connection closed without an answer ({text})"
    return text
