"""Profiling: one agent's profile windows and flame sessions, and what each cost.

- At most one profiler at a time in a process: a second `probe profile`, or one requested while
  the program's own ``torch.profiler`` runs (``torch.autograd._profiler_enabled()``), is refused
  with a 409 that says which; training is not touched.
- At most one flame session at a time per rank (two samplers would double the cost and halve
  nothing).
- Cost, measured on this rank and audited in ``python.audit`` (kind ``profile`` / ``flame``,
  outcome ``done``): the median step time inside the window over the median of the 20 steps
  before it (``python.steps``), both side by side in the row's ``code``.
- Trace files live in ``<run dir>/profiles/`` (0700); the newest ``KEEP_TRACES`` stay, older
  ones are removed when a new window finishes (a trace can be hundreds of MB).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..clock import StepClock
from ..errors import ConflictError
from ..jobs import JobTable
from ..step_cost import compare, describe_cost, steps_before
from .flame import FlameSession
from .window import ProfileWindow

log = logging.getLogger(__name__)

#: Trace files kept on disk per rank (the newest); finished windows kept in memory.
KEEP_TRACES = 3
KEEP_WINDOWS = 20



def other_profiler() -> str | None:
    """Why a new profiler cannot start now (the program's own torch.profiler), else None.

    ``torch.autograd._profiler_enabled()`` answers for the calling thread only (an HTTP thread
    sees False while the training thread profiles), so the process-wide flag that every
    ``torch.profiler``/``torch.autograd.profiler`` start sets is read too.
    """
    flag = getattr(sys.modules.get("torch.autograd.profiler"), "_is_profiler_enabled", False)
    autograd = sys.modules.get("torch.autograd")
    enabled = getattr(autograd, "_profiler_enabled", None)
    try:
        here = bool(enabled()) if enabled is not None else False
    except RuntimeError:
        here = False
    if flag is True or here:
        return ("a torch.profiler session is already active in this process (the program's "
                "own torch.profiler or torch.autograd.profiler); stop it first, or profile "
                "with it")
    return None


#: Records one row of the audit table: (client, code, outcome, error, ms, **action fields).
Audit = Callable[..., None]


class Profiling:
    """One agent's profile windows and flame sessions (agent.py builds one per agent).

    Args:
        run_dir: trace files go to ``<run_dir>/profiles``.
        rank: named in refusals; the agent updates it when the process group renumbers it.
        clock: the step clock; a window starts and stops at its boundaries.
        store: read for the step times before a window (the cost baseline).
        tracer: returns the torch tracer when it runs, else None (a window pauses its trace).
        audit: the agent's audit writer.
    """

    def __init__(self, run_dir: str, rank: int, clock: StepClock, store: Any,
                 tracer: Callable[[], Any], audit: Audit) -> None:
        self.rank = rank
        self.clock = clock
        self.store = store
        self.tracer = tracer
        self._audit = audit
        self.out_dir = os.path.join(run_dir, "profiles")
        self.windows: JobTable[ProfileWindow] = JobTable(
            "profile", lambda: self.rank, KEEP_WINDOWS, "`probe actions`")
        self.flames: JobTable[FlameSession] = JobTable(
            "flame session", lambda: self.rank, KEEP_WINDOWS, "`probe query \"select * from "
            "python.evals where kind = 'flame'\"`")
        self._lock = threading.Lock()

    # -- profile windows ----------------------------------------------------------------------
    def busy(self) -> str | None:
        """Why no profile window may start now, else None."""
        for w in self.windows:
            if not w.finished:
                return (f"`probe profile` {w.id} is already {w.state} on rank {self.rank} "
                        f"(steps {w.start_step + 1}..{w.last_step}); wait for it to finish")
        return other_profiler()

    def check_free(self) -> None:
        why = self.busy()
        if why is not None:
            raise ConflictError(f"profile refused on rank {self.rank}: {why}; nothing "
                                "was started and training goes on", reason="profiler-active")

    def start_window(self, action: Any, step: int) -> ProfileWindow:
        """The ``profile`` action at boundary ``step`` (training thread)."""
        with self._lock:
            self.check_free()
            args = action.args
            w = ProfileWindow(
                action_id=action.id, rank=self.rank, start_step=step,
                steps=int(args["steps"]), record_shapes=bool(args.get("record_shapes")),
                with_stack=bool(args.get("with_stack")),
                max_seconds=float(args["max_seconds"]), out_dir=self.out_dir,
                max_mb=float(args["max_mb"]),
                clock=self.clock, tracer=self.tracer(),
                on_done=lambda w, final: self._window_done(w, final, action.client,
                                                          action.requested_by),
            )
            w.start()
            return self.windows.add(w)

    def window(self, window_id: str) -> ProfileWindow:
        return self.windows.get(window_id)

    def stop(self) -> None:
        """The agent stops: no window outlives it."""
        for w in self.windows:
            w.cancel("the probe agent stopping")
        for f in self.flames:
            f.cancel()

    def _window_done(self, w: ProfileWindow, final: str, client: str,
                     requested_by: str | None) -> None:
        w.cost = self.step_cost([s["ms"] / 1e3 for s in w.step_spans()], w.start_step)
        self._trim_traces(keep=w)
        what = (f"profile steps {w.start_step + 1}..{w.last_step} ({w.stopped_by}): "
                f"{describe_cost(w.cost)}; trace {w.trace_bytes} bytes")
        ms = (w.boundaries[-1][1] - w.boundaries[0][1]) * 1e3 if len(w.boundaries) > 1 else 0.0
        self.audit("profile", w.id, w.start_step, what, final,
                   w.error, ms, client, requested_by)

    def _trim_traces(self, keep: ProfileWindow) -> None:
        done = [w for w in self.windows if w.trace_path and w is not keep]
        for w in done[: max(0, len(done) - (KEEP_TRACES - 1))]:
            try:
                os.unlink(w.trace_path or "")
            except OSError:
                pass
            w.trace_path = None

    # -- cost ---------------------------------------------------------------------------------
    def step_cost(self, window_s: list[float], before_step: int) -> dict[str, Any]:
        """Median step time in a window over the median of the steps before ``before_step``."""
        return compare(window_s, steps_before(self.store.query, time.time(), before_step))

    # -- flame sessions -----------------------------------------------------------------------
    def start_flame(self, flame_id: str, seconds: float, rate: float, client: str,
                    requested_by: str | None, sampler: str = "auto") -> FlameSession:
        with self._lock:
            for f in self.flames:
                if not f.finished:
                    since = time.strftime("%H:%M:%S", time.localtime(f.started))
                    raise ConflictError(
                        f"flame {f.id} is already sampling on rank {self.rank} "
                        f"({f.seconds:g} s from {since}); wait for it to finish",
                        reason="sampler-active")
            f = self.flames.add(FlameSession(self, flame_id, seconds, rate, client,
                                             requested_by, sampler))
        f.start()
        return f

    def flame(self, flame_id: str) -> FlameSession:
        return self.flames.get(flame_id)

    # -- audit --------------------------------------------------------------------------------
    def audit(self, kind: str, action_id: str, at_step: int | None, code: str, outcome: str,
              error: str | None, ms: float, client: str, requested_by: str | None) -> None:
        try:
            self._audit(client, code, outcome, error, ms, kind=kind, action_id=action_id,
                             at_step=at_step, requested_by=requested_by)
        except Exception as e:  # the audit table must never fail a profile or the training
            log.warning("probe agent: could not audit %s %s: %s", kind, action_id, e)


