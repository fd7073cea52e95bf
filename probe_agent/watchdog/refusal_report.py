"""The watchdog's refusals, reported to its rank's agent so that one audit table
(``python.audit``, kind 'access') and one counter (`probe info`) cover every public socket.

Exactly once, also across a GIL hold. A report is a POST over the agent's private socket. While
the rank's GIL is held the request is delivered (the kernel buffers it) but not answered within
the deadline; the agent applies it once its Python runs again. So a report that timed out may
still land: it is never rebuilt and re-counted. It keeps its id and is sent again, unchanged,
until the agent answers, and the agent applies each id once (``access.RefusalLog``). New
refusals wait for the next report meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from probe_protocol.bodies import RefusalReport
from probe_protocol.peers import Peer
from probe_protocol.routes import ACCESS_REFUSALS

from ..access import Refusal
from .httpwire import Request

#: Refusals listed per report; more are only counted (``unlisted``).
MAX_PENDING_REFUSALS = 100


class RefusalReporter:
    """Refusals not yet acknowledged by the agent.

    Args:
        ask: sends a request to the agent and returns ``(response head, reader, writer)``.
        alive: whether the rank's process still runs.
        deadline_s: how long one report waits for the agent's answer.
    """

    def __init__(self, ask: Callable[[Request], Awaitable[tuple[Any, Any, Any]]],
                 alive: Callable[[], bool], deadline_s: float) -> None:
        self.ask = ask
        self.alive = alive
        self.deadline_s = deadline_s
        self.pending: list[dict[str, str]] = []
        self.unlisted = 0
        #: The report sent and not acknowledged yet: sent again as it is, never rebuilt.
        self.unacked: bytes | None = None

    def add(self, peer: Peer, what: str, refusal: Refusal) -> None:
        """Queue one refusal for the agent's audit table."""
        if len(self.pending) >= MAX_PENDING_REFUSALS:
            self.unlisted += 1
            return
        self.pending.append({
            "client": peer.label()[:200], "what": what[:300], "reason": refusal.reason,
            "message": f"HTTP {refusal.status}: {refusal.message}"[:1000]})

    def next_body(self) -> bytes | None:
        """The report to send now: the unacknowledged one, else a new one, else None."""
        if self.unacked is None and (self.pending or self.unlisted):
            self.unacked = json.dumps(RefusalReport(
                tuple(self.pending), self.unlisted, id=secrets.token_hex(8)).to_wire()).encode()
            self.pending, self.unlisted = [], 0
        return self.unacked

    async def send_once(self) -> bool:
        """Send the current report; True when the agent acknowledged it."""
        body = self.next_body()
        if body is None or not self.alive():
            return False
        req = Request(ACCESS_REFUSALS.method, ACCESS_REFUSALS.path, "HTTP/1.1",
                      [("content-type", "application/json"),
                       ("content-length", str(len(body)))], body)
        try:
            head, _r, w = await asyncio.wait_for(self.ask(req), self.deadline_s)
            w.close()
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
            return False  # sent again next time, with the same id
        if head.status != 200:
            return False
        self.unacked = None
        return True

    async def run(self, every_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            await self.send_once()
