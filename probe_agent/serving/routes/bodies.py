"""Request bodies read within a cap, before anything parses them.

FastAPI reads and parses a declared body model before the route runs, however large it is: the
watchdog relays up to 64 MB, and a 10 MB query froze training for 23 s in the parser. The query
and eval routes therefore take the raw request and call ``read_body``, which

- refuses a declared Content-Length over the cap before reading a byte (413, naming the
  variable), and stops reading a chunked body as soon as it passes the cap;
- parses JSON with the stdlib (a nesting too deep for it is a 400, not a 500);
- checks it against the route's request class, a probe_protocol dataclass (``Request``: the
  same class the CLI builds the body with), a 422 naming every problem;
- refuses lone surrogates (``"\\udcff"`` is valid JSON but not text: DuckDB's binding raised
  TypeError and eval's audit row UnicodeEncodeError, both 500s).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

from fastapi import Request

from probe_protocol.requests import Request as WireRequest
from probe_protocol.requests import RequestError

from ...errors import ProbeAgentError, TooLargeError
from ...store.readonly import bad_text

Model = TypeVar("Model", bound=WireRequest)
#: The cap of a body that carries no text of its own cap (an action's arguments, a flame's
#: settings, a canned query's parameters).
SMALL_BODY = 64 * 1024
#: JSON escapes a byte as at most six (``\u0001``); a body within this of the text cap may
#: still hold text within it. The rest of the body (keys, max_rows) fits in the slack.
_ESCAPE = 6
_SLACK = 4096
#: A refused body up to this size is read to its end before the 413 (``_discard``): the
#: watchdog's own cap (watchdog/httpwire.py MAX_BODY), past which it refuses bodies itself.
DRAIN_BYTES = 1024 * 1024
DRAIN_S = 5.0


class BadBodyError(ProbeAgentError):
    status = 400


class MalformedRequestError(ProbeAgentError):
    """A body that does not fit its request class (probe_protocol.requests)."""

    status = 422


def _body_too_large(size: int, more: str, field: str, cap: int, limit: int,
                    var: str) -> TooLargeError:
    if not var:
        return TooLargeError(f"the request body is {size} bytes{more}: more than this route "
                             f"takes (at most {limit} bytes); send less")
    return TooLargeError(
        f"the request body is {size} bytes{more}: more than '{field}' within {var}={cap} bytes "
        f"can take (at most {limit} bytes with JSON escapes); send less, or raise {var} in the "
        "training job's environment")


async def _discard(request: Request, budget: int) -> None:
    """Read and drop the rest of a refused body, up to ``budget`` bytes. Answering before the
    sender has written it all and then closing breaks its write: the watchdog, writing a
    0.4-1 MiB body to our socket, got EPIPE and reported a 502 instead of our 413. Bodies up
    to the watchdog's own cap are cheap to drop; past it the sender is cut off."""
    async def drop() -> None:
        nonlocal budget
        async for chunk in request.stream():
            budget -= len(chunk)
            if budget < 0:
                return

    try:  # a sender that declares a body and never sends it is not waited for long
        await asyncio.wait_for(drop(), DRAIN_S)
    except asyncio.TimeoutError:
        pass


def body_limit(text_cap: int) -> int:
    """Largest body that may carry ``text_cap`` bytes of text, however it is escaped."""
    return text_cap * _ESCAPE + _SLACK


def openapi_body(model: type[WireRequest]) -> dict[str, Any]:
    """``openapi_extra`` that documents ``model`` as the JSON body (the route reads it itself)."""
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": model.json_schema()}}}}


async def read_body(request: Request, model: type[Model], field: str = "",
                    text_cap: int = SMALL_BODY, var: str = "") -> Model:
    """The body as ``model``: every route reads its body here. ``field`` is the text the cap
    ``var`` (``text_cap`` bytes) is for; a body without one is capped at ``SMALL_BODY``.

    Raises:
        TooLargeError (413) over the cap, BadBodyError (400) for JSON that cannot be parsed or
        text that is not text, MalformedRequestError (422) for the wrong shape.
    """
    limit = body_limit(text_cap)
    declared = request.headers.get("content-length", "")
    if declared.strip().isdigit() and int(declared) > limit:
        if int(declared) <= DRAIN_BYTES:
            await _discard(request, DRAIN_BYTES)
        raise _body_too_large(int(declared), "", field, text_cap, limit, var)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            await _discard(request, DRAIN_BYTES - len(raw))
            raise _body_too_large(len(raw), " or more", field, text_cap, limit, var)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise BadBodyError(
            f"malformed request: the body is not JSON ({type(e).__name__}: "
            f"{str(e)[:120]}); send a JSON object"
            + (f" like {{\"{field}\": \"...\"}}" if field else "")) from None
    try:
        body = model.from_wire(data)
    except RequestError as e:
        raise MalformedRequestError(f"malformed request: {e}") from None
    for name, value in body.fields().items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise BadBodyError(bad_text(name, e)) from None
    return body
