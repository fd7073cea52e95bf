"""ProfileWindow: torch.profiler over optimizer steps S+1 .. S+N of one rank.

Timeline (every call on the training thread, from the agent's StepClock, unless said otherwise)
-----------------------------------------------------------------------------------------------
- boundary S, the ``profile`` step-boundary action (actions/profile.py), after every rank agreed
  through the job's store that it reached S: the module tracer is paused (``set_mode("off")``),
  ``torch.profiler.profile`` starts, and a ``ProfilerStep#S+1`` span opens;
- boundaries S+1 .. S+N-1 (our own StepClock subscriber): the step span closes and the next opens;
- boundary S+N: the profiler stops, the tracer's mode comes back, and a daemon thread
  (``probe-agent.profile-export``) writes the Chrome trace. The per-operator totals are the CLI's
  (from that trace): torch's own (``key_averages()``) parse every event into Python objects,
  which held this process's GIL for seconds after a window (bench/bench_profile.py).
Every rank starts and stops at the same step boundary, so a collective inside the window is
recorded on every rank or on none: never half.

Ceiling: the window ends on the agent's side whatever the CLI does (it may have died). After
``max_seconds`` a timer (``probe-agent.profile-ceiling``) asks the training thread to stop the
profiler at its next module call or step boundary, whichever comes first: torch's profiler is
the starting thread's (its state is thread-local), and stopping it from another thread crashed
torch 2.13 (SIGSEGV at the export, measured), so only the training thread ever stops it. The
request is a global ``nn.Module`` forward pre-hook that removes itself after one call (global
hooks slow every module call, so it exists only between the ceiling and that call). A training
thread blocked for good (a hang) records nothing meanwhile, so the trace does not grow; the
window then stays open, and refuses other profiles, until the thread moves again.

Tracing and profiling: the tracer's hooks would show up in the profile as extra work, and the
profiler's callbacks would inflate every module's time in ``python.torch_trace``. So the tracer
is off for the window (no ``torch_trace`` rows, ``python.steps.traced`` false), and back from
step S+N+2 (the tracer applies its mode at each boundary before this window's subscriber runs,
so S+N+1 is untraced too). A mode the operator set meanwhile (`probe trace on`) is left as is.

CUDA activities are recorded only when the job already initialised CUDA: the agent never
creates a CUDA context (DESIGN). Nothing here imports torch before ``start()``.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import patches
from .memory import give_back, rss_mib

log = logging.getLogger(__name__)

#: The export's peak over the RSS recording added (memory.py), as measured with
#: --record-shapes --with-stack on an 8-layer MLP: 30 steps +11 MiB recording, +158 MiB at the
#: peak (x14); 83 steps +34 MiB, +669 MiB (x20).
EXPORT_FACTOR = 20.0


def _drop_events(prof: Any) -> None:
    """Free the window's events now, by reference counting.

    ``torch.profiler.profile`` sits in a reference cycle (its ``action_map`` holds its own bound
    methods), and the events with it (``profiler.kineto_results``): dropped alone they stayed
    until a full collection, 415 -> 609 MiB after a 30-step window. A ``gc.collect()`` here
    walked the whole heap holding the GIL (0.1-0.3 s on a small job, seconds on a big heap),
    so the references are cut by hand: the events go at once and only a small shell is left
    for the collector."""
    inner = getattr(prof, "profiler", None)
    if inner is not None:
        for name in ("kineto_results", "_function_events", "_old_function_events"):
            if hasattr(inner, name):
                try:
                    setattr(inner, name, None)
                except Exception:  # another torch's attribute layout: the collector frees it
                    pass
    if prof is not None and hasattr(prof, "profiler"):
        prof.profiler = None
    if isinstance(getattr(prof, "action_map", None), dict):
        prof.action_map.clear()


def _mib(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


class ProfileWindow:
    """One rank's profiler window; see the module docstring.

    Args:
        action_id: the step-boundary action's id, the same on every rank.
        start_step: S, the boundary the profiler starts at (steps S+1 .. S+N are recorded).
        steps: N.
        max_seconds: the ceiling: the profiler stops after this long whatever the steps do.
        max_mb: the memory budget: the window ends at the first step boundary where the RSS
            has grown more than this since it started (memory.py).
        out_dir: where the trace file goes (a private directory under the run dir).
        clock: the agent's StepClock (its subscriber drives the window).
        tracer: the module tracer, or None; paused for the window.
        on_done: called on the export thread once the trace is on disk (or failed).
    """

    def __init__(self, *, action_id: str, rank: int, start_step: int, steps: int,
                 record_shapes: bool, with_stack: bool, max_seconds: float, out_dir: str,
                 clock: Any, tracer: Any, on_done: Callable[[ProfileWindow, str], None],
                 max_mb: float) -> None:
        self.id = action_id
        self.rank = rank
        self.start_step = start_step
        self.last_step = start_step + steps
        self.steps = steps
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.max_seconds = max_seconds
        self.max_mb = max_mb
        #: RSS (MiB) when the window started, at its largest boundary, and after the export.
        self.rss_start: float | None = None
        self.rss_peak: float | None = None
        self.rss_after: float | None = None
        self.out_dir = out_dir
        self.clock = clock
        self.tracer = tracer
        self.on_done = on_done
        #: recording | exporting | done | error
        self.state = "recording"
        self.error: str | None = None
        self.stopped_by: str | None = None
        #: (step, epoch seconds) at each boundary seen, S first.
        self.boundaries: list[tuple[int, float]] = []
        self.activities: list[str] = []
        self.trace_path: str | None = None
        self.trace_bytes = 0
        self.cost: dict[str, Any] = {}
        self.export_ms = 0.0
        self.stop_ms = 0.0
        self._prof: Any = None
        self._span: Any = None
        self._unsubscribe: Callable[[], None] | None = None
        self._timer: threading.Timer | None = None
        self._owner: int | None = None  # the thread that started the profiler (training)
        self._stop_hook: Any = None
        self._tls: Any = None
        self.overdue: str | None = None  # why the window must end at the next chance
        self._tracer_mode: str | None = None
        #: The tracer's mode the window paused (None: tracing was off, nothing paused).
        self.paused_mode: str | None = None
        self._lock = threading.Lock()

    # -- training thread ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the profiler now (boundary S). Raises when torch refuses (another profiler)."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        self.activities = [a.name for a in activities]
        self._prof = profile(activities=activities, record_shapes=self.record_shapes,
                             with_stack=self.with_stack)
        self._pause_tracer()
        self._owner = threading.get_ident()
        self.rss_start = self.rss_peak = rss_mib()
        try:
            self._prof.start()
        except BaseException:
            self._prof = None
            self._restore_tracer()
            raise
        try:
            self.boundaries.append((self.start_step, time.time()))
            self._open_span(self.start_step + 1)
            self._unsubscribe = self.clock.subscribe(self._on_step, f"profile window {self.id}")
        except BaseException:  # never leave a profiler running that nothing will stop
            self._prof.stop()
            self._prof = None
            self._restore_tracer()
            raise
        # A program that ends inside the window must not exit with the profiler on: that
        # crashed the interpreter at exit (SIGSEGV, torch 2.13, measured). The main thread
        # stops it at exit; any other training thread when it ends, from its thread-local
        # storage, which CPython clears on that very thread.
        atexit.register(self._at_exit)
        self._exit_record = patches.setting(
            "atexit", f"profile window {self.id} stops its profiler", by="profiling",
            why="a program that exits with the profiler on crashed the interpreter (torch 2.13)")
        self._tls = threading.local()
        self._tls.guard = _OwnerExit(self)
        self._timer = threading.Timer(self.max_seconds, self._ceiling)
        self._timer.daemon = True
        self._timer.name = "probe-agent.profile-ceiling"
        self._timer.start()

    @property
    def finished(self) -> bool:
        return self.state in ("done", "error")

    def _on_step(self, step: int, optimizer: Any) -> None:
        with self._lock:
            if self.state != "recording" or threading.get_ident() != self._owner:
                return
            self.boundaries.append((step, time.time()))
            self._check_budget()
            if step < self.last_step and self.overdue is None:
                self._close_span()
                self._open_span(step + 1)
                return
        self.close(self.overdue or f"step {step}")

    def _check_budget(self) -> None:
        rss = rss_mib()
        if rss is None or self.rss_start is None:
            return
        self.rss_peak = max(self.rss_peak or rss, rss)
        grown = rss - self.rss_start
        projected = grown * EXPORT_FACTOR
        if projected > self.max_mb and self.overdue is None:
            self.overdue = (f"its memory budget (RSS grew {grown:.0f} MiB while recording, "
                            f"about {projected:.0f} MiB with the export, over "
                            f"max_mb={self.max_mb:g})")
            log.warning("probe agent: profile %s on rank %d: %s; the window ends at this step",
                        self.id, self.rank, self.overdue)

    def _owner_ended(self) -> None:
        if self.state == "recording":
            self.close("the training thread ending")

    def _at_exit(self) -> None:
        try:
            if threading.get_ident() == self._owner:
                self.close("the program exiting")
        except Exception as e:  # at exit: say it, never raise
            log.warning("probe agent: profile %s: stopping at exit failed: %s", self.id, e)

    def _on_module(self, module: Any, args: Any) -> None:
        """The global forward pre-hook armed by ``request_stop`` (training thread only)."""
        try:
            if threading.get_ident() == self._owner:
                self.close(self.overdue or "a stop request")
        except Exception as e:  # inside the program's forward: never into the training loop
            log.warning("probe agent: profile %s: stopping failed: %s", self.id, e)

    def _open_span(self, step: int) -> None:
        from torch.autograd.profiler import record_function

        # The name TensorBoard and Perfetto users know from prof.step(); the number is the
        # agent's step, the same on every rank, so spans line up by name across ranks.
        self._span = record_function(f"ProfilerStep#{step}")
        self._span.__enter__()

    def _close_span(self) -> None:
        span, self._span = self._span, None
        if span is not None:
            span.__exit__(None, None, None)

    # -- any thread ---------------------------------------------------------------------------
    def _ceiling(self) -> None:
        self.request_stop(f"the {self.max_seconds:g} s ceiling")

    def request_stop(self, why: str) -> None:
        """End the window at the training thread's next module call or step boundary."""
        with self._lock:
            if self.state != "recording" or self.overdue is not None:
                return
            self.overdue = why
            from torch.nn.modules.module import register_module_forward_pre_hook

            self._stop_hook = register_module_forward_pre_hook(self._on_module)
        log.warning("probe agent: profile %s on rank %d: %s reached at step %s (the window was "
                    "steps %d..%d); the profiler stops at the training thread's next module "
                    "call or step", self.id, self.rank, why, self.clock.current_step,
                    self.start_step + 1, self.last_step)

    def close(self, why: str) -> None:
        """Stop the profiler (once; on the thread that started it) and hand the trace to the
        export thread."""
        if threading.get_ident() != self._owner:
            raise RuntimeError("the profiler can only be stopped by the thread that started it")
        with self._lock:
            if self.state != "recording":
                return
            self.state = "exporting"
            self.stopped_by = why
            if self._unsubscribe is not None:
                self._unsubscribe()
            if self._timer is not None:
                self._timer.cancel()
            if self._stop_hook is not None:
                self._stop_hook.remove()
            atexit.unregister(self._at_exit)
            if self._exit_record is not None:
                self._exit_record.done()
            self._tls = None  # its guard goes now (the state is no longer "recording")
            t0 = time.perf_counter()
            try:
                self._close_span()
                self._prof.stop()
            except Exception as e:  # a profiler that cannot stop must not break training
                self.state, self.error = "error", f"stopping the profiler: {type(e).__name__}: {e}"
                log.warning("probe agent: profile %s on rank %d: %s", self.id, self.rank,
                            self.error)
            finally:
                self.stop_ms = (time.perf_counter() - t0) * 1e3
                self._restore_tracer()
        th = threading.Thread(target=self._export, name="probe-agent.profile-export",
                              daemon=True)
        th.start()

    def cancel(self, why: str) -> None:
        """The agent stops: end the window as soon as the training thread can."""
        self.request_stop(why)

    # -- export thread ------------------------------------------------------------------------
    def _export(self) -> None:
        # At the job's own priority, not in the background: Kineto's save is C++ that holds
        # the GIL from start to end (a Python thread beside it ran twice in 88 ms), so the
        # training thread waits for it whatever this thread's priority. At SCHED_IDLE beside
        # two busy loops the save and its clean-up got almost no CPU while holding the GIL,
        # and the training thread stood still for minutes (py-spy: the trainer waiting for the
        # GIL, this thread active+gil for 50+ s). Lower priority only lengthens the stall.
        prof, self._prof = self._prof, None
        t0 = time.perf_counter()
        final = self.state if self.state != "exporting" else "error"
        try:
            if self.state == "exporting" and prof is not None:
                os.makedirs(self.out_dir, mode=0o700, exist_ok=True)
                path = os.path.join(self.out_dir, f"rank{self.rank}-{self.id}.json")
                prof.export_chrome_trace(path)
                self.trace_path, self.trace_bytes = path, os.path.getsize(path)
                final = "done"
        except Exception as e:  # the export thread's own failure: reported, never raised
            self.error = f"exporting the trace: {type(e).__name__}: {e}"
            log.warning("probe agent: profile %s on rank %d: %s", self.id, self.rank, self.error)
        finally:
            _drop_events(prof)
            del prof
            give_back()
            self.rss_after = rss_mib()
            self.export_ms = (time.perf_counter() - t0) * 1e3
            try:
                self.on_done(self, final)  # the cost and the audit row, before "done" is seen
            finally:
                self.state = final

    # -- the tracer ---------------------------------------------------------------------------
    def _pause_tracer(self) -> None:
        t = self.tracer
        if t is not None and getattr(t, "mode", "off") != "off":
            self._tracer_mode = self.paused_mode = t.mode
            t.set_mode("off")

    def _restore_tracer(self) -> None:
        t, mode, self._tracer_mode = self.tracer, self._tracer_mode, None
        # Only our own "off": a mode the operator chose during the window stays.
        if t is not None and mode is not None and t.mode == "off":
            t.set_mode(mode)

    # -- reporting ----------------------------------------------------------------------------
    def step_spans(self) -> list[dict[str, Any]]:
        """Each recorded step with its start and end (epoch seconds), from the boundaries."""
        b = self.boundaries
        return [{"step": s1, "start": t0, "end": t1, "ms": round((t1 - t0) * 1e3, 3)}
                for (_, t0), (s1, t1) in zip(b, b[1:])]

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id, "rank": self.rank, "pid": os.getpid(), "state": self.state,
            "error": self.error,
            "first_step": self.start_step + 1, "last_step": self.last_step,
            "steps": self.steps, "stopped_by": self.stopped_by, "activities": self.activities,
            "record_shapes": self.record_shapes, "with_stack": self.with_stack,
            "max_seconds": self.max_seconds, "overdue": self.overdue, "max_mb": self.max_mb,
            "rss_mib": {"start": _mib(self.rss_start), "peak": _mib(self.rss_peak),
                        "after": _mib(self.rss_after)},
            "step_spans": self.step_spans(),
            "trace_bytes": self.trace_bytes, "cost": self.cost,
            "stop_ms": round(self.stop_ms, 3), "export_ms": round(self.export_ms, 3),
            "tracer_paused": self.paused_mode,
        }


class _OwnerExit:
    """Lives in the training thread's thread-local storage only: collected when that thread
    ends, on that thread, while it can still stop its profiler (see ``start``)."""

    def __init__(self, window: ProfileWindow) -> None:
        self.window = window

    def __del__(self) -> None:
        try:
            if threading.get_ident() == self.window._owner:
                self.window._owner_ended()
        except Exception as e:  # never raise from a destructor on a dying thread
            log.warning("probe agent: could not stop the profiler as its thread ended: %s", e)
