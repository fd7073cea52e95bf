"""Just enough HTTP/1.1 for the watchdog's proxy (stdlib only).

Requests: a head (at most ``MAX_HEAD`` bytes) and a ``Content-Length`` body; chunked request
bodies are refused (no probe client sends them). Responses from the agent are relayed with
their ``Content-Length``; one without it is relayed until the agent closes, and the client
connection is then closed too.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from probe_protocol.envelope import encode, error_body
from probe_protocol.routes import CLIENT_HEADER

MAX_HEAD = 64 * 1024
#: The largest request body relayed: the agent's biggest legitimate body (a query or an eval at
#: its 64 KiB cap, JSON-escaped: 6 x 64 KiB + 4 KiB) with room to spare. A 64 MB body used to be
#: read and relayed whole.
MAX_BODY = 1024 * 1024
REASONS = {
    100: "Continue", 200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found", 410: "Gone", 413: "Payload Too Large", 500: "Internal Server Error",
    502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
}
#: Never forwarded: they describe one hop, not the request.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer",
                        "transfer-encoding", "upgrade", "expect", CLIENT_HEADER})


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    path: str = ""
    query: dict[str, list[str]] = field(default_factory=dict)

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    def flag(self, name: str) -> bool:
        value = (self.query.get(name) or ["0"])[-1].lower()
        return value in ("1", "true", "yes", "on")

    @property
    def keep_alive(self) -> bool:
        conn = (self.header("connection") or "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn


async def read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> Request | None:
    """The next request on a connection; None when the client closed it between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            return None
        raise BadRequest(400, "incomplete request head") from None
    except asyncio.LimitOverrunError:
        raise BadRequest(413, f"request head over {MAX_HEAD} bytes") from None
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ", 2)
    except ValueError:
        raise BadRequest(400, "malformed request line") from None
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest(400, "malformed header line")
        headers.append((name.strip(), value.strip()))
    req = Request(method.upper(), target, version.upper(), headers)
    parts = urlsplit(target)
    req.path, req.query = parts.path, parse_qs(parts.query)
    if (req.header("transfer-encoding") or "").lower() not in ("", "identity"):
        raise BadRequest(400, "chunked request bodies are not supported; send Content-Length")
    try:
        length = int(req.header("content-length") or 0)
    except ValueError:
        raise BadRequest(400, "bad Content-Length") from None
    if length < 0 or length > MAX_BODY:
        raise BadRequest(413, f"request body over {MAX_BODY} bytes; queries and eval code are "
                              "capped far below that (PROBE_MAX_SQL_BYTES, PROBE_MAX_EVAL_BYTES)")
    if length and (req.header("expect") or "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if length:
        req.body = await reader.readexactly(length)
    return req


def forward_head(req: Request, client: str) -> bytes:
    """The request as sent to the agent: one request per connection, client identity added."""
    lines = [f"{req.method} {req.target} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in req.headers if k.lower() not in HOP_BY_HOP]
    if req.header("host") is None:  # HTTP/1.1 requires it (h11 refuses requests without)
        lines.append("host: localhost")
    lines += [f"{CLIENT_HEADER}: {client}", "connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


def json_response(status: int, body: dict[str, Any], *, close: bool = False,
                  headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    data = encode(body)
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}",
             "content-type: application/json", f"content-length: {len(data)}"]
    lines += [f"{k}: {v}" for k, v in headers]
    if close:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data


def error_response(rank: int, status: int, message: str, *, close: bool = False,
                   headers: tuple[tuple[str, str], ...] = (), **extra: Any) -> bytes:
    """A probe error body (``envelope.error_body``) as a whole response."""
    return json_response(status, error_body(rank, status, message, **extra), close=close,
                         headers=headers)


@dataclass(slots=True)
class ResponseHead:
    status: int
    raw_lines: list[str]
    length: int | None

    def relay_head(self, close: bool) -> bytes:
        lines = [self.raw_lines[0]]
        lines += [ln for ln in self.raw_lines[1:]
                  if ln and ln.split(":", 1)[0].strip().lower() not in ("connection", "keep-alive")]
        if close:
            lines.append("connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def read_response_head(reader: asyncio.StreamReader) -> ResponseHead:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    return ResponseHead(status, [ln for ln in lines if ln], length)
