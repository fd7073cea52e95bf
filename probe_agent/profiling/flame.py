"""FlameSession: sample this rank's Python stacks for T seconds, then say what it cost (issue 16).

The sampler (collectors/sampler.py) runs on its own daemon thread ``probe-agent.sampler`` and
ends by itself after ``seconds`` (the ceiling the route enforced), whether or not anyone asks for
the result: a CLI that died leaves nothing running. Then the cost: the median step time of the
steps that ran entirely inside the sampled window over the median of the 20 steps before it
(``python.steps``), plus the sampler thread's own CPU time; both go to the audit table
(``python.evals`` kind ``flame``, outcome ``done``) and back to the CLI.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from typing import TYPE_CHECKING, Any

from ..collectors.sampler import StackSampler

if TYPE_CHECKING:
    from .sessions import Profiling

log = logging.getLogger(__name__)


class FlameSession:
    def __init__(self, owner: Profiling, flame_id: str, seconds: float, rate: float,
                 client: str, requested_by: str | None) -> None:
        self.owner = owner
        self.id = flame_id
        self.seconds = seconds
        self.rate = rate
        self.client = client
        self.requested_by = requested_by
        #: sampling | done | error
        self.state = "sampling"
        self.error: str | None = None
        self.started = time.time()
        self.ended: float | None = None
        self.sampler = StackSampler(rate)
        self.cost: dict[str, Any] = {}
        self._folded: dict[str, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-agent.sampler",
                                        daemon=True)

    def start(self) -> None:
        self.owner.audit("flame", self.id, self.owner.agent.stepclock.current_step,
                         f"flame {self.seconds:g} s at {self.rate:g} Hz", "started", None, 0.0,
                         self.client, self.requested_by)
        self._thread.start()

    def cancel(self) -> None:
        self._stop.set()

    def wait(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self.sampler.run(self.seconds, self._stop)
            self.ended = time.time()
            self._folded = self.sampler.folded()
            self.sampler.counts.clear()  # the code objects: let them go
            self.cost = self._cost()
            self.state = "done"
        except Exception as e:  # the sampler's own failure: reported, training unaffected
            self.state, self.error = "error", f"{type(e).__name__}: {e}"
            log.warning("probe agent: flame %s failed: %s", self.id, self.error)
        finally:
            self.ended = self.ended or time.time()
            self.owner.audit("flame", self.id, self.owner.agent.stepclock.current_step,
                             f"flame {self.seconds:g} s at {self.rate:g} Hz: "
                             f"{describe(self.cost)}", self.state, self.error,
                             (self.ended - self.started) * 1e3, self.client, self.requested_by)

    def _cost(self) -> dict[str, Any]:
        s = self.sampler
        cost: dict[str, Any] = {
            "samples": s.samples, "missed_ticks": s.missed_ticks,
            "sampler_cpu_ms": round(s.cpu_s * 1e3, 3), "elapsed_s": round(s.elapsed_s, 3),
            "sampler_cpu_share": round(s.cpu_s / s.elapsed_s, 5) if s.elapsed_s else None,
        }
        t0, t1 = self.started, self.ended or time.time()
        store = self.owner.agent.store
        try:
            inside = store.query("SELECT duration FROM python.steps WHERE start_time >= ? AND "
                                 "end_time <= ? AND duration IS NOT NULL", [t0, t1]).rows
            before = store.query("SELECT duration FROM python.steps WHERE end_time <= ? AND "
                                 "duration IS NOT NULL ORDER BY step DESC LIMIT 20", [t0]).rows
        except Exception as e:  # the measure is a courtesy; a store problem must not fail it
            log.info("probe agent: no step times for the cost of a flame: %s", e)
            return cost
        win = [float(r[0]) for r in inside]
        base = [float(r[0]) for r in before]
        cost.update(window_steps=len(win), before_steps=len(base))
        if win:
            cost["window_ms"] = round(statistics.median(win) * 1e3, 3)
        if base:
            cost["before_ms"] = round(statistics.median(base) * 1e3, 3)
        if win and base and cost["before_ms"] > 0:
            cost["ratio"] = round(cost["window_ms"] / cost["before_ms"], 3)
        return cost

    def describe(self, stacks: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "state": self.state, "error": self.error, "seconds": self.seconds,
            "rate": self.rate, "started": self.started, "ended": self.ended,
            "samples": self.sampler.samples, "cost": self.cost,
        }
        if stacks and self.state == "done":
            body["folded"] = self._folded or {}
        return body


def describe(cost: dict[str, Any]) -> str:
    parts = [f"{cost.get('samples', 0)} samples",
             f"sampler CPU {cost.get('sampler_cpu_ms', 0):.0f} ms"]
    if "ratio" in cost:
        parts.append(f"step time x{cost['ratio']:.3f} ({cost['window_ms']:.1f} ms vs "
                     f"{cost['before_ms']:.1f} ms before)")
    return ", ".join(parts)
