"""Is the agent's event loop serving? Asked while a forwarded request waits.

A wedged event loop beside a live training thread keeps the heartbeat fresh, so a forwarded
request would wait the proxy's MAX_WAIT_S with no answer. A slow route is no sign of it
(queries and evals run off the loop), so the loop itself is asked: a ``GET /v1/health`` that
does not answer within the deadline means nothing on the loop will. The first check starts
half a deadline into the wait, so a wedged loop is answered within 1.5 deadlines; a request
that finishes sooner costs no check at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from probe_protocol.routes import HEALTH


class LoopCheck:
    """One waiting request's checks. ``fetch(path)`` returns the body, or None when the agent
    did not answer within the deadline."""

    def __init__(self, fetch: Callable[[str], Awaitable[Any]], deadline_s: float) -> None:
        self._fetch = fetch
        self._deadline_s = deadline_s
        self._next = deadline_s / 2
        self._pending: asyncio.Future[Any] | None = None

    def wedged(self, waited: float) -> bool:
        """True once a check went unanswered; call it as the wait goes on (``waited`` s)."""
        if waited < self._next:
            return False
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._fetch(HEALTH.path))
            return False
        if not self._pending.done():
            return False
        answered = self._pending.result() is not None
        self._pending, self._next = None, waited + self._deadline_s
        return not answered

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
