"""The agent behind the watchdog: one request per connection on its private unix socket.

Separate from proxy.py because it is the one place that speaks to the agent: the proxy's
forwarding, the health checks of liveness.py, the periodic snapshots (main.py), the node route
and the refusal reports all reach the agent through ``Upstream``, and none of them deals with a
client's connection. Deciding how long to wait, and what to answer when the agent does not, stays
in proxy.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from .httpwire import Request, ResponseHead, forward_head, read_response_head

#: Bytes read at a time, from the agent and from a client being drained (proxy.py).
CHUNK = 64 * 1024
#: How long the agent may pause between two chunks of one answer before the relay gives up;
#: the same minute a quiet owner's keep-alive connection gets (proxy.IDLE_S).
RELAY_IDLE_S = 60.0


class Upstream:
    """Requests to the agent at ``inner_path`` (``<run_dir>/<pid>.agent``).

    Args:
        inner_path: the agent's private socket; a rank that died or is stopping refuses it, and
            callers see the OSError.
        deadline_s: what ``fetch`` waits for the whole answer (PROBE_BACKTRACE_DEADLINE_MS);
            ``ask`` and ``relay`` leave the waiting to their caller.
    """

    def __init__(self, inner_path: str, deadline_s: float) -> None:
        self.inner_path = inner_path
        self.deadline_s = deadline_s

    async def ask(self, req: Request, client: str) -> tuple[ResponseHead, Any, Any]:
        """Send ``req`` on a new connection, as ``client``; the answer's head, and the
        connection's reader and writer for its body (the caller closes the writer)."""
        r, w = await asyncio.open_unix_connection(self.inner_path, limit=CHUNK)
        try:
            w.write(forward_head(req, client) + req.body)
            await w.drain()
            head = await read_response_head(r)
        except BaseException:
            w.close()
            raise
        return head, r, w

    async def relay(self, writer: asyncio.StreamWriter, head: ResponseHead, r: Any,
                    w: Any) -> bool:
        """Copy the answer ``ask`` returned to the client; False when the client's connection
        must close afterwards (an answer with no length ends only at the close)."""
        close = head.length is None
        try:
            writer.write(head.relay_head(close))
            left = head.length
            while left is None or left > 0:
                want = CHUNK if left is None else min(CHUNK, left)
                data = await asyncio.wait_for(r.read(want), RELAY_IDLE_S)
                if not data:
                    if left:
                        return False  # the agent went away mid-body; the client sees it short
                    break
                writer.write(data)
                await writer.drain()
                if left is not None:
                    left -= len(data)
        finally:
            w.close()
        return not close

    async def read_json(self, head: ResponseHead, r: Any, w: Any,
                        limit: int = 16 * 1024 * 1024) -> dict[str, Any] | None:
        """The whole JSON body of the answer ``ask`` returned (then closed), for a caller that
        adds to it (the backtrace's children); None when it has no length, is over ``limit``
        bytes or is not a JSON object: the caller then relays nothing and says why."""
        try:
            if head.length is None or head.length > limit:
                return None
            data = await asyncio.wait_for(r.readexactly(head.length), RELAY_IDLE_S)
            body = json.loads(data)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
            return None
        finally:
            w.close()
        return body if isinstance(body, dict) else None

    async def fetch(self, target: str) -> dict[str, Any] | None:
        """``GET target`` as the watchdog itself: the JSON body of a 200, or None when the
        agent did not answer that within the deadline."""
        req = Request("GET", target, "HTTP/1.1", [])
        try:
            head, r, w = await asyncio.wait_for(self.ask(req, "watchdog"), self.deadline_s)
            try:
                if head.status != 200 or head.length is None:
                    return None
                data = await asyncio.wait_for(r.readexactly(head.length), self.deadline_s)
            finally:
                w.close()
            body = json.loads(data)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
            return None
        return body if isinstance(body, dict) else None
