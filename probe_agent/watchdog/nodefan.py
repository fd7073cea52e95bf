"""The node route's relay: ask this node's ranks over their unix sockets, all at once, and merge.

``POST /v1/node/fanout`` (probe_protocol/nodefan.py) lets the CLI ask one address per node
instead of one per rank. Every watchdog serves it; the CLI picks one per node.

Whose authority (docs/decisions/cli-and-transport.md, "Fan-out at scale"):

- the caller has already passed this watchdog's own access check (owner or token) for the route;
- only ranks that this job's rank list places on this host are asked (with a token, only
  entries signed with it), at ``<run_dir>/<pid>.sock`` in this watchdog's own run dir, and only
  when the socket's owner (SO_PEERCRED) is our uid or root: a pid from the list cannot point the
  relay at a file of another user;
- the caller's ``Authorization`` header goes with each relayed request, unchanged, and each rank
  checks it again (a wrong token is refused even though the relay is the rank's owner);
- only read routes are relayed (backtrace, query, collectives): no eval and no action passes
  through here.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from probe_protocol import nodefan
from probe_protocol.envelope import encode
from probe_protocol.peers import unix_peer_uid
from probe_protocol.routes import BACKTRACE, COLLECTIVES, QUERY

from .httpwire import ResponseHead, read_response_head

#: Largest answer read from one rank (a backtrace with locals of a deep stack is ~1 MB).
MAX_RANK_BYTES = 8 * 1024 * 1024
#: Seconds a node request may give each rank at most, and by default (the CLI sends its own,
#: a little under its client timeout, so the node answers before the CLI gives up on it).
MAX_TIMEOUT_S = 120.0
DEFAULT_TIMEOUT_S = 5.0
CHUNK = 64 * 1024


class NodeRelay:
    """Relays one node request to the local ranks of this job.

    Args:
        run_dir: this rank's run dir; only ``<pid>.sock`` files in it are dialled.
        token: the job's token (entries of the rank list must be signed with it).
        host: this node's name as the rank list spells it.
        rank: the serving rank (the answer's ``rank``).
    """

    def __init__(self, run_dir: str, token: str | None, host: str | None,
                 rank: int | None) -> None:
        self.run_dir = run_dir
        self.token = token
        self.host = host
        self.rank = rank

    async def answer(self, body: bytes, auth: str | None,
                     entries: Sequence[Mapping[str, Any]]) -> tuple[int, dict[str, Any]]:
        """``(status, body)`` for one node request; ``entries``: the job's rank list."""
        try:
            parsed = nodefan.read_request(json.loads(body or b"null"))
        except ValueError:
            parsed = "the body is not JSON"
        if isinstance(parsed, str):
            return 400, {"ok": False, "rank": self.rank, "status": 400,
                         "error": f"bad node request: {parsed}"}
        route, params, wanted = parsed
        local = nodefan.local_ranks(entries, self.host, self.token)
        timeout = _timeout(params.pop("timeout_s", None))

        async def one(rank: int) -> tuple[int, int, dict[str, Any]]:
            pid = local.get(rank)
            if pid is None:
                return rank, 0, {"ok": False, "rank": rank, "status": 0, "error": (
                    f"rank {rank} is not on {self.host} in this job's rank list")}
            try:
                status, got = await asyncio.wait_for(
                    self._ask(pid, route, params, auth), timeout)
            except asyncio.TimeoutError:
                status, got = 0, {"ok": False, "rank": rank, "status": 0,
                                  "error": f"no answer within {timeout:g} s"}
            except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    IndexError) as e:
                status, got = 0, {"ok": False, "rank": rank, "status": 0,
                                  "error": f"{type(e).__name__}: {e}"}
            return rank, status, got

        answers = await asyncio.gather(*(one(r) for r in wanted))
        return 200, nodefan.merge(route, {"rank": self.rank, "host": self.host}, list(answers))

    async def _ask(self, pid: int, route: str, params: dict[str, Any],
                   auth: str | None) -> tuple[int, dict[str, Any]]:
        path = os.path.join(self.run_dir, f"{int(pid)}.sock")
        r, w = await asyncio.open_unix_connection(path, limit=CHUNK)
        try:
            uid = unix_peer_uid(w.get_extra_info("socket"))
            if uid not in (os.getuid(), 0):
                raise PermissionError(f"{path} is served by uid {uid}, not this job's owner")
            w.write(_request(route, params, auth))
            await w.drain()
            head = await read_response_head(r)
            body = json.loads(await _read_body(r, head))
        finally:
            w.close()
        if not isinstance(body, dict):
            raise ValueError("not a probe body")
        return head.status, body


async def _read_body(r: asyncio.StreamReader, head: ResponseHead) -> bytes:
    """The answer's body: by its length, chunked (the agent streams query rows), or until the
    rank's watchdog closes; at most MAX_RANK_BYTES."""
    if head.length is not None:
        if head.length > MAX_RANK_BYTES:
            raise ValueError(f"answer over {MAX_RANK_BYTES} bytes")
        return await r.readexactly(head.length)
    chunked = any(ln.lower().replace(" ", "") == "transfer-encoding:chunked"
                  for ln in head.raw_lines[1:])
    if not chunked:
        data = await r.read(MAX_RANK_BYTES + 1)
        while len(data) <= MAX_RANK_BYTES and (more := await r.read(CHUNK)):
            data += more
        if len(data) > MAX_RANK_BYTES:
            raise ValueError(f"answer over {MAX_RANK_BYTES} bytes")
        return data
    parts: list[bytes] = []
    size = 0
    while True:
        n = int((await r.readuntil(b"\r\n")).split(b";", 1)[0].strip() or b"0", 16)
        if n == 0:
            return b"".join(parts)
        size += n
        if size > MAX_RANK_BYTES:
            raise ValueError(f"answer over {MAX_RANK_BYTES} bytes")
        parts.append(await r.readexactly(n))
        await r.readexactly(2)  # the chunk's CRLF


def _timeout(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return min(float(value), MAX_TIMEOUT_S)
    return DEFAULT_TIMEOUT_S


def _request(route: str, params: dict[str, Any], auth: str | None) -> bytes:
    """The HTTP request for one rank: the read route only, with the caller's token."""
    if route == "backtrace":
        flags: dict[str, int] = {k: int(bool(params.get(k)))
                                 for k in ("locals", "native", "all", "secrets", "children")
                                 if k in params}
        target, data = BACKTRACE.path + ("?" + urlencode(flags) if flags else ""), b""
        method = "GET"
    elif route == "collectives":
        args = {k: params[k] for k in ("limit", "state")
                if isinstance(params.get(k), int | str) and not isinstance(params[k], bool)}
        target, data = COLLECTIVES.path + ("?" + urlencode(args) if args else ""), b""
        method = "GET"
    else:
        query: dict[str, Any] = {k: params[k] for k in ("sql", "max_rows") if k in params}
        target, data, method = QUERY.path, encode(query), "POST"
    lines = [f"{method} {target} HTTP/1.1", "host: localhost", "connection: close",
             f"content-length: {len(data)}"]
    if data:
        lines.append("content-type: application/json")
    if auth is not None:
        lines.append(f"authorization: {auth}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data
