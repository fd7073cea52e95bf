"""NumericsRecorder: the loss and gradient health of every step -> ``python.numerics``.

What runs when
--------------
- **Every step**, right before the first ``optimizer.step()`` of the step (a global optimizer
  pre-hook, so the weights are still the ones that made this step's gradients): the step's
  loss from the loss meter (loss.py), the total gradient norm (the one ``clip_grad_norm_``
  computed when the script clips, unscaled when it clipped scaled gradients; else one
  ``torch._foreach_norm`` over the optimizer's gradients), and a finite check of both. That
  check reads two numbers from the device (on CUDA, a wait for the backward to finish, right
  before the optimizer would run anyway). One ``(total)`` row per step.
- **Bad steps**: a loss above ``spike_factor`` x the recent level and ``spike_mads`` robust
  deviations above it, on the log of the loss (probe_protocol/loss_spike.py), or a
  non-finite loss or norm: what is kept of them, and the first non-finite step's re-run, are
  bad_steps.py's. Under FSDP2 the ranks agree on each step's numbers first (sharded.py).
- **Traced steps** (the tracer's sampling): per-module rows (module_stats.py).
- **Checks armed by an operator** (`probe guard`): ``on_check`` is called with the step's
  numbers before the optimizer runs, and may make it skip the step (actions/guard.py).

What the step was given (its root calls, its batches' sample indices) is step_inputs.py's.
"""

from __future__ import annotations

import collections
import math
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from probe_protocol import loss_spike

from .. import optim_hooks
from . import Guard, Sink
from .bad_steps import BadSteps
from .loss import LossMeter, to_float
from .module_stats import ActivationHook, ModuleMap, StepStats, total_norm
from .numerics_rows import TABLE, NumericsRows
from .numerics_rows import to_float as row_float
from .registry import CollectorSpec
from .sharded import Agreement
from .step_inputs import StepInputs
from .torch_import import imported

if TYPE_CHECKING:
    from ..clock import StepClock
    from .tracer.tracer import TorchTracer
    from .trainloop import LoopMonitor

#: Recent losses the spike check compares with (probe_protocol/loss_spike.py).
WINDOW = loss_spike.WINDOW
#: Thresholds: settable while the job runs (`probe numerics --set NAME=VALUE`, every rank);
#: doctor and `probe numerics` read them from the ranks, so all judge alike.
DEFAULTS: dict[str, float] = {
    "spike_factor": 2.0,   # a loss this many times the recent median ...
    "spike_mads": 5.0,     # ... and this many robust deviations above it (of the log-loss)
    "clip_share": 0.5,     # clipping on this share of steps is "clipping on most steps"
    "clip_far": 3.0,       # median pre-clip norm this many times max_norm: raise max_norm
    "stall_ratio": 1e-4,   # update/weight ratios below this (loss flat): LR far too low
    "high_ratio": 1e-1,    # update/weight ratios above this: the LR is far too high
    "chance_margin": 0.1,  # a loss within this share of ln(classes) is chance level
}


class NumericsRecorder:
    """Collector for python.numerics (see the module docstring)."""

    def __init__(self, clock: StepClock, rank: int, tracer: TorchTracer | None,
                 loop: LoopMonitor | None) -> None:
        self.clock, self.rank, self.tracer, self.loop = clock, rank, tracer, loop
        self.guard = Guard("numerics recorder")
        self.loss = LossMeter()
        self.thresholds = dict(DEFAULTS)
        self.out = NumericsRows(rank)
        self.sink: Sink | None = None
        self._schema: pa.Schema | None = None
        self._handle: Any = None
        self._unsubscribe: Any = None
        self._torch: Any = None
        self._lock = threading.Lock()
        self._stopped = False
        self._paused = False  # set_active(False)
        #: the FSDP2 agreement (sharded.py); False without DTensors; None before the 1st step
        self.sharded: Agreement | bool | None = None
        self._leave = False  # stopped while agreeing: the next step's pre-hook says so once
        # per step (training thread)
        self._begun = False
        self.step_loss: tuple[Any, str | None, int] = (None, None, 0)
        self.inputs = StepInputs()
        self._stats: StepStats | None = None
        self._acts: ActivationHook | None = None
        self.recent: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.bad = BadSteps(self.out, self.inputs, self.loss)
        self.last: dict[str, Any] = {}
        self._pending_total: tuple[Any, ...] | None = None
        self._next_act_values: dict[str, list[Any]] = {}
        #: the armed step guard (actions/guard.py, set by its action at a step boundary):
        #: ``check`` before the optimizer runs, ``after_step`` once it did
        self.step_guard: Any = None

    # -- collector protocol ------------------------------------------------------------------
    def start(self, sink: Sink) -> None:
        self.sink, self._schema = sink, sink.arrow_schema(TABLE)
        self._unsubscribe = self.clock.subscribe(self._on_step, "numerics recorder")
        if self.loop is not None:
            self.loop.on_scale = self.loss.scaled
            self.loop.on_batch = self.inputs.on_batch
        sink.add_flusher(self.flush)
        sink.add_ticker(self.poll)
        self.poll()

    def stop(self) -> None:
        # The store's last flush and tick run after the collectors stop: poll() must not wrap
        # again then (a stale wrapper would keep this agent alive and record for it).
        with self._lock:
            self._stopped = True
            # the other ranks call sharded.agree at every step: this rank's pre-hook stays for
            # one more step to leave with them (sharded.py), else they would wait for it
            self._leave = isinstance(self.sharded, Agreement) and self.sharded.bound and \
                self._handle is not None
        try:
            if self._unsubscribe is not None:
                self._unsubscribe()
            if self._handle is not None and not self._leave:
                self._handle.remove()
                self._handle = None
            if self.loop is not None:
                self.loop.on_scale = self.loop.on_batch = None
            self.loss.uninstall()
            if self._acts is not None:
                self._acts.off()
            self.inputs.remove()
        finally:
            self.flush()

    def set_active(self, active: bool) -> None:
        """Switch the per-step capture off and on again (training thread, between steps):
        bench/bench_numerics.py measures the recorder against the same agent without it."""
        if not active:
            with self._lock:
                self._paused = True
                if self._handle is not None:
                    self._handle.remove()
                    self._handle = None
                self.loss.uninstall()
            if self._unsubscribe is not None:
                self._unsubscribe()
                self._unsubscribe = None
            return
        with self._lock:
            self._paused = False
        if self._unsubscribe is None:
            self._unsubscribe = self.clock.subscribe(self._on_step, "numerics recorder")
        self.poll()

    def poll(self) -> None:
        """Writer tick and first step: wrap what the program has imported."""
        with self._lock:
            if self._stopped or self._paused:
                return
            self.loss.install()
            if self._handle is None and (mod := imported("torch.optim.optimizer")) is not None \
                    and hasattr(mod, "register_optimizer_step_pre_hook"):
                self._torch = sys.modules["torch"]
                self._handle = optim_hooks.register(mod, "pre", self._on_opt_pre)
            self.inputs.wrap_dataloader()
        try:
            self.inputs.find_model(self._torch, self.clock, self.tracer)
        except Exception as e:  # noqa: BLE001 - writer thread: counted
            self.guard.failed(e)

    def set_thresholds(self, values: dict[str, float]) -> dict[str, float]:
        """Change thresholds (HTTP thread); unknown names raise KeyError."""
        for k, v in values.items():
            if k not in DEFAULTS:
                raise KeyError(k)
            if not math.isfinite(float(v)) or float(v) < 0:
                raise ValueError(f"{k} must be a finite number >= 0, not {v!r}")
        self.thresholds = {**self.thresholds, **{k: float(v) for k, v in values.items()}}
        return dict(self.thresholds)

    # -- training thread -----------------------------------------------------------------------
    def module_map(self) -> ModuleMap | None:
        return self.inputs.module_map()

    def _on_opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        if self._leave or (isinstance(self.sharded, Agreement) and self.sharded.bound and
                           not self.guard.enabled):
            self._leave_agreement(optimizer)  # before _begun: after stop() no step resets it
            return None
        if self._begun or not self.guard.enabled:
            return None
        # A step given a closure (Lightning, LBFGS) runs forward and backward inside step():
        # its loss and gradients exist only once the closure returned. The closure is
        # wrapped (a pre-hook may return new arguments) and the check runs right after it,
        # still before the update. ``args`` is what step() got, the optimizer first.
        closure = (kwargs or {}).get("closure")
        at = "kw" if closure is not None else None
        if closure is None and len(args) > 1 and callable(args[1]):
            closure, at = args[1], "pos"
        if closure is not None:
            def checked() -> Any:
                out = closure()
                self._begin(optimizer)
                return out

            if at == "kw":
                return args, {**kwargs, "closure": checked}
            return (args[0], checked, *args[2:]), kwargs
        self._begin(optimizer)
        return None

    def _begin(self, optimizer: Any) -> None:
        if self._begun:
            return
        self._begun = True
        if isinstance(self.sharded, Agreement):
            self.sharded.agreed = False
        try:
            self._check(optimizer)
        except Exception as e:  # noqa: BLE001 - inside optimizer.step(): counted
            self.guard.failed(e)
            sh = self.sharded
            if isinstance(sh, Agreement) and sh.bound and not sh.agreed:  # may agree now
                self._leave_agreement(optimizer)

    def _leave_agreement(self, optimizer: Any) -> None:
        """Take part in the agreement once more, saying this rank leaves (at the agreed start
        when it is still ahead); no rank calls it again (sharded.py). Then the pre-hook goes if
        the recorder stopped."""
        sh = self.sharded
        try:
            if isinstance(sh, Agreement) and sh.leave(self._torch, optimizer):
                self._leave = True  # back at the next step's pre-hook
                return
        except Exception as e:  # noqa: BLE001 - counted; nothing more to agree on
            self.guard.failed(e)
        self._leave = False
        if self._stopped and self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _check(self, optimizer: Any) -> None:
        torch = self._torch
        self.step_loss = self.loss.take()
        loss = self.step_loss[0]
        norm, clip_max = self._norm(torch, optimizer)
        lf = to_float(loss)
        gf = to_float(norm)
        nonfinite = (lf is not None and not math.isfinite(lf)) or \
            (gf is not None and not math.isfinite(gf))
        if self.sharded is None:
            self.sharded = Agreement.of(optimizer) or False
        sh = self.sharded
        rerun = True
        if isinstance(sh, Agreement) and sh.poll(optimizer):
            # FSDP2: the whole model's norm, and every rank knows of a NaN
            ready = self.bad.first_nonfinite is None and self.module_map() is not None
            gf, nonfinite, rerun = sh.agree(torch, lf, gf, clip_max is None,
                                            len(self.inputs.calls) if ready else 0)
        spike = self._spike(lf)
        before = list(self.recent)
        if lf is not None and math.isfinite(lf):
            self.recent.append(lf)
        # the clock numbers the step, and the rows made before, when it counts it (_on_step)
        self.last = {"step": None, "loss": lf, "grad_norm": gf, "spike": spike,
                     "nonfinite": nonfinite, "clip_max_norm": clip_max}
        self._pending_total = (time.time(), gf, clip_max, nonfinite, spike)
        mm = self.bad.keep(torch, self.module_map, spike, nonfinite, lf, gf, rerun,
                           isinstance(sh, Agreement) and sh.on)
        if self.tracer is not None and self.tracer.recording and self._stats is None:
            mm = mm or self.module_map()
            if mm is not None and mm.params:
                self._stats = StepStats(torch, mm)
                self._stats.acts = self.take_acts()
        guard = self.step_guard
        if guard is not None:
            guard.check(dict(self.last), before, self.clock.current_step + 1)

    def _norm(self, torch: Any, optimizer: Any) -> tuple[Any, float | None]:
        loop = self.loop
        if loop is not None and loop.clip_calls and loop.clip_norm is not None:
            scale = loop.clip_scale
            norm = loop.clip_norm
            if scale is not None:
                norm = norm / scale
            return norm, row_float(loop.clip_max)
        with torch.no_grad():
            return total_norm(torch, optimizer), None

    def _spike(self, lf: float | None) -> float | None:
        """The factor over the recent level when this loss is a spike (the rule doctor applies
        too: probe_protocol/loss_spike.py), else None."""
        if lf is None:
            return None
        t = self.thresholds
        found = loss_spike.spike(self.recent, lf, t["spike_factor"], t["spike_mads"])
        return found[0] if found else None

    def _on_step(self, step: int, optimizer: Any) -> None:
        """StepClock subscriber: the step's rows; set up the next step."""
        torch = self._torch or sys.modules.get("torch")
        self._torch = torch
        self._skipped_step()
        self._begun = False
        guard = self.step_guard
        if guard is not None:
            guard.after_step()
        first = self.bad.first_nonfinite
        if first is not None and first.get("step") is None:
            first["step"] = step
        self.last["step"] = step
        pending, self._pending_total = self._pending_total, None
        if pending is not None:
            ts, gf, clip_max, nonfinite, spike = pending
            self.out.add(ts, step, "(total)", "step", grad_norm=gf, grad_nonfinite=nonfinite,
                      clip_max=clip_max, note=f"spike x{spike:.2f}" if spike else None)
        stats, self._stats = self._stats, None
        if stats is not None:
            try:
                stats.after_step(torch)
                self.out.add(time.time(), step, "", "module-stats", note=stats)
            except Exception as e:  # noqa: BLE001 - training thread: counted
                self.guard.failed(e)
        self.out.stamp(step)
        self.inputs.step_done()
        try:
            self.inputs.keep_root(torch, self.tracer, self.clock)
            self._next_acts(step)
        except Exception as e:  # noqa: BLE001 - training thread: counted
            self.guard.failed(e)

    def _next_acts(self, step: int) -> None:
        """Install the activation hook for the next step when it is traced."""
        tracer = self.tracer
        want = tracer is not None and tracer.armed and tracer.guard.enabled and \
            tracer.traced(step + 1) and self.guard.enabled
        if not want:
            if self._acts is not None:
                self._acts.off()
            return
        mm = self.module_map()
        if mm is None:
            return
        if self._acts is None:
            self._acts = ActivationHook(self._torch, self.guard.failed)
        self._next_act_values = {}
        self._acts.root = mm.model
        self._acts.on(mm.modules, self._next_act_values)

    def take_acts(self) -> dict[str, list[Any]]:
        acts, self._next_act_values = self._next_act_values, {}
        return acts

    def loss_for_step(self) -> tuple[Any, str | None, int]:
        """The loss of the step the clock just counted: steps.py asks in its subscriber, which
        runs before this recorder's (start order, registry.py)."""
        self._skipped_step()
        return self.step_loss

    def _skipped_step(self) -> None:
        """No pre-hook ran in this step (the GradScaler skipped optimizer.step()): take the
        loss now."""
        if not self._begun:
            self._begun = True
            self.step_loss = self.loss.take()
            lf = to_float(self.step_loss[0])
            self._pending_total = (time.time(), None, None,
                                   lf is not None and not math.isfinite(lf), None)

    @property
    def first_nonfinite(self) -> dict[str, Any] | None:
        return self.bad.first_nonfinite

    def state(self) -> dict[str, Any]:
        return {"thresholds": dict(self.thresholds), "last": dict(self.last),
                "first_nonfinite": self.bad.first_nonfinite, "anomalies": self.bad.anomalies,
                "loss_source": self.loss.source, "wrapped": self.loss.installed(),
                "classes": self._acts.classes if self._acts is not None else None,
                "guard": self.step_guard.state() if self.step_guard is not None else None,
                "failures": self.guard.failures, "disabled": not self.guard.enabled,
                "sharded": self.sharded.state() if isinstance(self.sharded, Agreement) else None}

    # -- writer thread -----------------------------------------------------------------------
    def flush(self) -> None:
        if self.sink is None or self._schema is None:
            return
        table = self.out.table(self._schema)
        if table is not None:
            self.sink.append(TABLE, table)


#: This collector, for the registry (registry.py): after the loop monitor (its GradScaler).
COLLECTOR = CollectorSpec(
    "numerics", 65, needs=("tracer", "trainloop"), tables=("python.numerics",),
    build=lambda b: NumericsRecorder(b.clock, b.rank, b.get("tracer"), b.get("trainloop")))
