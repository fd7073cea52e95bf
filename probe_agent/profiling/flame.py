"""FlameSession: sample this rank's Python stacks for T seconds, then say what it cost.

Samplers (``sampler``): ``py-spy`` (``py-spy record --nonblocking`` from a child process,
pyspy.py), ``in-process`` (collectors/sampler.py, a thread walking ``sys._current_frames()``),
or ``auto``: py-spy where it is installed and may read this process, else in-process (the
reason is kept in ``sampler_note``). Why py-spy first: measured side by side at 100 Hz
(bench/bench_profile.py) it cost the training thread nothing measurable, the in-process walk
1-5% (it needs the GIL for every sample); see pyspy.py for what py-spy costs instead.

Either runs on the session's daemon thread ``probe-agent.sampler`` and ends by itself after
``seconds`` (the ceiling the route enforced), whether or not anyone asks for the result: a CLI
that died leaves nothing running. Then the cost: the median step time of the steps that ran
entirely inside the sampled window over the median of the 20 steps before it (``python.steps``),
plus the sampler's own CPU time; both go to the audit table (``python.audit`` kind ``flame``,
outcome ``done``) and back to the CLI.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from ..collectors.sampler import StackSampler
from ..step_cost import measure
from . import pyspy

if TYPE_CHECKING:
    from .sessions import Profiling

log = logging.getLogger(__name__)


class FlameSession:
    def __init__(self, owner: Profiling, flame_id: str, seconds: float, rate: float,
                 client: str, requested_by: str | None, sampler: str = "auto") -> None:
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
        self.mode = sampler  # auto | py-spy | in-process (what was asked)
        self.used: str | None = None  # what ran
        self.note: str | None = None  # why py-spy did not, when it did not
        self.window: tuple[float, float] | None = None
        self.cost: dict[str, Any] = {}
        self._folded: dict[str, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-agent.sampler",
                                        daemon=True)

    def start(self) -> None:
        self.owner.audit("flame", self.id, self.owner.clock.current_step,
                         f"flame {self.seconds:g} s at {self.rate:g} Hz", "started", None, 0.0,
                         self.client, self.requested_by)
        self._thread.start()

    def cancel(self) -> None:
        self._stop.set()

    def wait(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            cpu_s = self._sample()
            self.ended = time.time()
            self.cost = self._cost(cpu_s)
            self.state = "done"
        except Exception as e:  # the sampler's own failure: reported, training unaffected
            self.state, self.error = "error", f"{type(e).__name__}: {e}"
            log.warning("probe agent: flame %s failed: %s", self.id, self.error)
        finally:
            self.ended = self.ended or time.time()
            self.owner.audit("flame", self.id, self.owner.clock.current_step,
                             f"flame {self.seconds:g} s at {self.rate:g} Hz: "
                             f"{describe(self.cost)}", self.state, self.error,
                             (self.ended - self.started) * 1e3, self.client, self.requested_by)

    def _sample(self) -> float:
        """Run the sampler; returns its CPU seconds. Sets ``_folded``, ``used``, ``note``."""
        if self.mode != "in-process":
            exe = pyspy.find_pyspy()
            if exe is None:
                self.note = "py-spy is not installed (pip install 'probe-torch[agent]')"
            else:
                t0 = time.time()
                folded, cpu, why = pyspy.record(exe, os.getpid(), self.seconds, self.rate,
                                                self.owner.out_dir)
                if folded is not None:
                    self.used, self._folded = "py-spy", folded
                    self.window = (t0, time.time())
                    return cpu
                self.note = why
            if self.mode == "py-spy":
                raise RuntimeError(f"py-spy was asked for and cannot run: {self.note}")
        self.used = "in-process"
        t0 = time.time()
        self.sampler.run(self.seconds, self._stop)
        self.window = (t0, time.time())
        self._folded = self.sampler.folded()
        self.sampler.counts.clear()  # the code objects: let them go
        return self.sampler.cpu_s

    def _cost(self, cpu_s: float) -> dict[str, Any]:
        t0, t1 = self.window or (self.started, self.ended or time.time())
        elapsed = max(t1 - t0, 1e-9)
        cost: dict[str, Any] = {
            "sampler": self.used, "samples": sum((self._folded or {}).values()),
            "sampler_cpu_ms": round(cpu_s * 1e3, 3), "elapsed_s": round(elapsed, 3),
            "sampler_cpu_share": round(cpu_s / elapsed, 5),
        }
        cost.update(measure(self.owner.store.query, t0, t1))
        return cost

    @property
    def finished(self) -> bool:
        return self.state != "sampling"

    def describe(self, stacks: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "state": self.state, "error": self.error, "seconds": self.seconds,
            "rate": self.rate, "started": self.started, "ended": self.ended,
            "sampler": self.used or self.mode, "sampler_note": self.note,
            "samples": self.cost.get("samples", 0), "cost": self.cost,
        }
        if stacks and self.state == "done":
            body["folded"] = self._folded or {}
        return body


def describe(cost: dict[str, Any]) -> str:
    parts = [f"{cost.get('sampler')} sampler", f"{cost.get('samples', 0)} samples",
             f"sampler CPU {cost.get('sampler_cpu_ms', 0):.0f} ms"]
    if "ratio" in cost:
        parts.append(f"step time x{cost['ratio']:.3f} ({cost['window_ms']:.1f} ms vs "
                     f"{cost['before_ms']:.1f} ms before)")
    return ", ".join(parts)
