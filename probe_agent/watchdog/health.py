"""The rank's health as a scheduler polls it (``GET /v1/health?status``), answered by the
watchdog: it runs beside the rank, so it answers within milliseconds while the rank's GIL is
held, and it is there after the rank died.

States: ``dead`` (the process is gone), ``hung`` (no optimizer step for longer than the stall
limit, or the rank's Python has not run for that long: a held GIL), ``starting`` (no step yet:
a liveness probe must not kill a job that is loading), ``healthy``. The stall limit is
``max(stall_s, STALL_STEPS x the median gap between steps)``: a job with 2-minute steps is not
hung after 5 minutes. ``stall_s`` defaults to ``STALL_S`` and a probe may ask for its own
(``?stall=S``). Straggling is a job-level verdict (it needs every rank's collectives): `probe
health` adds it.

Step progress is sampled from the heartbeat file once a second (``tick``), so the age of the
last step is known without asking the rank.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from typing import Any

#: Default stall limit, seconds: conservative, a liveness probe's restart is expensive.
STALL_S = 300.0
#: ... and never under this many typical steps.
STALL_STEPS = 20
TICK_S = 1.0


class HealthWatch:
    """Samples ``rank`` (a RankWatch: ``alive``, ``heartbeat()``, ``exit``) once a second."""

    def __init__(self, rank: Any) -> None:
        self.rank = rank
        self.step: int | None = None
        self.step_at: float | None = None  # monotonic time the step last changed
        self.gaps: deque[float] = deque(maxlen=64)
        self._handle: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = loop.call_later(TICK_S, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        self.sample()
        if self.rank.alive:
            self._handle = loop.call_later(TICK_S, self._tick, loop)

    def sample(self) -> tuple[float, int | None] | None:
        hb = self.rank.heartbeat()
        now = time.monotonic()
        if hb is not None and hb[1] is not None and hb[1] != self.step:
            if self.step is not None and self.step_at is not None and hb[1] > self.step:
                self.gaps.append((now - self.step_at) / (hb[1] - self.step))
            self.step, self.step_at = hb[1], now
        return hb

    def state(self, stall_s: float | None = None) -> dict[str, Any]:
        """This rank's health now, as HealthBody's fields."""
        if not self.rank.alive:
            e = self.rank.exit or {}
            return {"state": "dead", "reason": str(e.get("description") or "exited"),
                    "step": self.rank.last_step}
        hb = self.sample()
        beat_age = hb[0] if hb is not None else None
        typical = statistics.median(self.gaps) if self.gaps else None
        limit = max(stall_s if stall_s is not None else STALL_S,
                    STALL_STEPS * typical if typical else 0.0)
        step_age = time.monotonic() - self.step_at if self.step_at is not None else None
        out: dict[str, Any] = {"step": self.step, "heartbeat_age_s": _r(beat_age),
                               "step_age_s": _r(step_age), "typical_step_s": _r(typical)}
        if beat_age is not None and beat_age > limit:
            return {**out, "state": "hung", "reason": f"its Python has not run for "
                    f"{beat_age:.0f} s (the GIL is held; stall limit {limit:.0f} s)"}
        if step_age is not None and step_age > limit:
            return {**out, "state": "hung", "reason": f"no optimizer step for {step_age:.0f} s "
                    f"(stall limit {limit:.0f} s" + (f"; its steps take {typical:.2f} s)"
                                                      if typical else ")")}
        if self.step is None:
            return {**out, "state": "starting", "reason": "no optimizer step yet"}
        return {**out, "state": "healthy", "reason": "stepping"}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def http_status(state: str) -> int:
    """200 for a rank a scheduler should leave alone, 503 for one it may act on."""
    return 503 if state in ("hung", "dead") else 200
