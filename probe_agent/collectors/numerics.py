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
- **Anomalies**: a loss above ``spike_factor`` x the recent level and ``spike_mads`` robust
  deviations above it, on the log of the loss (probe_protocol/loss_spike.py), or a
  non-finite loss or norm: the per-module gradient norms of that step and the DataLoader
  sample indices of its batches are kept (``anomaly`` rows, at most ``MAX_ANOMALIES``). On the
  first non-finite step, the step is re-run once to find where the value was born
  (nan_hunt.py; one ``origin`` row).
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
from .loss import LossMeter, to_float
from .module_stats import ActivationHook, ModuleMap, StepStats, module_grad_norms, total_norm
from .nan_hunt import origin, origin_note
from .numerics_rows import TABLE, NumericsRows
from .numerics_rows import to_float as row_float
from .registry import CollectorSpec
from .sharded import agree, gate, is_sharded
from .step_inputs import StepInputs, samples_text
from .torch_import import imported

if TYPE_CHECKING:
    from ..clock import StepClock
    from .tracer.tracer import TorchTracer
    from .trainloop import LoopMonitor

#: Recent losses the spike check compares with (probe_protocol/loss_spike.py).
WINDOW = loss_spike.WINDOW
#: Anomaly captures (per-module norms of a spike or non-finite step) kept per run.
MAX_ANOMALIES = 20
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
        self._sharded: bool | None = None  # steps DTensor parameters (sharded.py)
        self.sharded_off: str | None = None  # why the ranks do not agree (sharded.gate)
        self._agreed = False  # this step's sharded.agree ran (each step, on every rank)
        self._leave = False  # stopped while agreeing: the next step's pre-hook says so once
        # per step (training thread)
        self._begun = False
        self.step_loss: tuple[Any, str | None, int] = (None, None, 0)
        self.inputs = StepInputs()
        self._stats: StepStats | None = None
        self._acts: ActivationHook | None = None
        self.recent: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.anomalies = 0
        #: the first non-finite step and what the re-run found (doctor's evidence)
        self.first_nonfinite: dict[str, Any] | None = None
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
            self._leave = bool(self._sharded) and self._handle is not None
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
        if self._leave or (self._sharded and not self.guard.enabled):
            self._leave_agreement()  # before _begun: after stop() no step resets it
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
        self._agreed = False
        try:
            self._check(optimizer)
        except Exception as e:  # noqa: BLE001 - inside optimizer.step(): counted
            self.guard.failed(e)
            if self._sharded and not self._agreed:  # the other ranks are in agree: leave
                self._leave_agreement()

    def _leave_agreement(self) -> None:
        """Take part in this step's agreement once more, saying this rank leaves; no rank
        calls it again (sharded.py). Then the pre-hook goes if the recorder stopped."""
        self._leave = False
        if self._sharded:
            self._sharded = False
            self.sharded_off = "a rank's numerics recorder stopped"
            try:
                agree(self._torch, None, None, False, 0, leaving=True)
            except Exception as e:  # noqa: BLE001 - counted; nothing more to agree on
                self.guard.failed(e)
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
        # Rows made before the clock counts this step get its number then (_on_step): the
        # first step's number may come from the optimizer's own count.
        step = None
        nonfinite = (lf is not None and not math.isfinite(lf)) or \
            (gf is not None and not math.isfinite(gf))
        if self._sharded is None and is_sharded(optimizer):
            ok, why = gate(self.clock.current_step + 1)  # every rank takes part, or none
            self._sharded, self.sharded_off = ok, None if ok else why
        elif self._sharded is None:
            self._sharded = False
        rerun = True
        if self._sharded:  # FSDP2: the whole model's norm, and every rank knows of a NaN
            ready = self.first_nonfinite is None and self.module_map() is not None
            self._agreed = True
            gf, nonfinite, rerun, stay = agree(torch, lf, gf, clip_max is None,
                                               len(self.inputs.calls) if ready else 0)
            if not stay:  # another rank's recorder stopped: every rank stops agreeing here
                self._sharded, self.sharded_off = False, "a rank's numerics recorder stopped"
        spike = self._spike(lf)
        before = list(self.recent)
        if lf is not None and math.isfinite(lf):
            self.recent.append(lf)
        self.last = {"step": step, "loss": lf, "grad_norm": gf, "spike": spike,
                     "nonfinite": nonfinite, "clip_max_norm": clip_max}
        self._pending_total = (time.time(), gf, clip_max, nonfinite, spike)
        mm = None
        if (spike or nonfinite) and self.anomalies < MAX_ANOMALIES:
            self.anomalies += 1
            mm = self.module_map()
            self._anomaly(torch, step, mm, spike, nonfinite)
        if nonfinite and self.first_nonfinite is None:
            self._hunt(torch, step, lf, gf, mm or self.module_map(), rerun)
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

    def _anomaly(self, torch: Any, step: int | None, mm: ModuleMap | None,
                 spike: float | None, nonfinite: bool) -> None:
        now = time.time()
        samples = samples_text(self.inputs.batch_ids)
        what = "nonfinite" if nonfinite else f"spike x{spike:.2f}"
        self.out.add(now, step, "(total)", "anomaly", note=what, samples=samples)
        for name, g in module_grad_norms(torch, mm):
            self.out.add(now, step, name, "anomaly", grad_norm=g,
                         grad_nonfinite=not math.isfinite(g))

    def _hunt(self, torch: Any, step: int | None, lf: float | None, gf: float | None,
              mm: ModuleMap | None, rerun: bool = True) -> None:
        self.loss.paused = True  # the re-run's backward is not the step's loss
        try:
            info = origin(torch, mm, self.inputs.calls, self.inputs.batch_ids, lf, gf, rerun,
                          bool(self._sharded))
        finally:
            self.loss.paused = False
        info["step"] = step
        self.first_nonfinite = info
        self.out.add(time.time(), step, info.get("module") or "(none)", "origin",
                     stage=info.get("stage"), role=info.get("role"), op=info.get("op"),
                     samples=", ".join(str(s) for s in info.get("samples") or []) or None,
                     note=origin_note(info))

    def _on_step(self, step: int, optimizer: Any) -> None:
        """StepClock subscriber: the step's rows; set up the next step."""
        torch = self._torch or sys.modules.get("torch")
        self._torch = torch
        self._skipped_step()
        self._begun = False
        guard = self.step_guard
        if guard is not None:
            guard.after_step()
        if self.first_nonfinite is not None and self.first_nonfinite.get("step") is None:
            self.first_nonfinite["step"] = step
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
            self.inputs.keep_root(torch, self.tracer)
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

    def state(self) -> dict[str, Any]:
        return {"thresholds": dict(self.thresholds), "last": dict(self.last),
                "first_nonfinite": self.first_nonfinite, "anomalies": self.anomalies,
                "loss_source": self.loss.source, "wrapped": self.loss.installed(),
                "classes": self._acts.classes if self._acts is not None else None,
                "guard": self.step_guard.state() if self.step_guard is not None else None,
                "failures": self.guard.failures, "disabled": not self.guard.enabled}

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
