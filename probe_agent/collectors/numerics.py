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
- **Anomalies**: a loss above ``spike_factor`` x the median of the last ``WINDOW`` losses (and
  above the median by ``spike_mads`` robust deviations, so a noisy loss does not count), or a
  non-finite loss or norm: the per-module gradient norms of that step and the DataLoader
  sample indices of its batches are kept (``anomaly`` rows, at most ``MAX_ANOMALIES``). On the
  first non-finite step, the step is re-run once to find where the value was born
  (nan_hunt.py; one ``origin`` row).
- **Traced steps** (the tracer's sampling): per-module rows (module_stats.py).
- **Checks armed by an operator** (`probe guard`): ``on_check`` is called with the step's
  numbers before the optimizer runs, and may make it skip the step (actions/guard.py).

Sample indices: ``_BaseDataLoaderIter._next_index`` is wrapped to keep the indices of each
batch the sampler hands out, in order, on the iterator (a worker pool asks ahead; batches come
back in that order); the loop monitor's ``__next__`` wrapper pops them as batches are taken.
"""

from __future__ import annotations

import collections
import functools
import math
import statistics
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from .. import optim_hooks, patches
from . import Guard, Sink
from .loss import LossMeter, to_float
from .module_stats import ActivationHook, ModuleMap, StepStats, grad_norms, total_norm, unwrap
from .nan_hunt import hunt
from .registry import CollectorSpec
from .sharded import agree, is_sharded
from .torch_import import imported

if TYPE_CHECKING:
    from ..clock import StepClock
    from .tracer.tracer import TorchTracer
    from .trainloop import LoopMonitor

TABLE = "python.numerics"
BUFFER = 100_000
#: Recent losses the spike check compares with (their median and MAD).
WINDOW = 50
#: Anomaly captures (per-module norms of a spike or non-finite step) kept per run.
MAX_ANOMALIES = 20
#: Root calls (micro-batches) of one step kept for a re-run.
MAX_CALLS = 64
#: Thresholds: settable while the job runs (`probe numerics --set NAME=VALUE`, every rank);
#: doctor and `probe numerics` read them from the ranks, so all judge alike.
DEFAULTS: dict[str, float] = {
    "spike_factor": 2.0,   # a loss this many times the recent median ...
    "spike_mads": 6.0,     # ... and this many robust deviations above it is a spike
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
        self.rows: list[tuple[Any, ...]] = []
        self.sink: Sink | None = None
        self._schema: pa.Schema | None = None
        self._handle: Any = None
        self._unsubscribe: Any = None
        self._torch: Any = None
        self._dl: patches.Patch | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._paused = False  # set_active(False)
        self._found: Any = None  # the model a heap walk found (_find_model)
        self._sharded: bool | None = None  # steps DTensor parameters (sharded.py)
        self._find_at = -1e9
        # per step (training thread)
        self._begun = False
        self.step_loss: tuple[Any, str | None, int] = (None, None, 0)
        self.calls: list[tuple[Any, Any, Any]] = []
        self.batch_ids: list[Any] = []
        self._stats: StepStats | None = None
        self._acts: ActivationHook | None = None
        self._root: Any = None
        self._root_hook: Any = None
        self._map: ModuleMap | None = None
        self.recent: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.anomalies = 0
        #: the first non-finite step and what the re-run found (doctor's evidence)
        self.first_nonfinite: dict[str, Any] | None = None
        self.last: dict[str, Any] = {}
        self._pending_total: tuple[Any, ...] | None = None
        #: this step's rows (training thread only), stamped with its number by _on_step
        self._held: list[tuple[Any, ...]] = []
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
            self.loop.on_batch = self._on_batch
        sink.add_flusher(self.flush)
        sink.add_ticker(self.poll)
        self.poll()

    def stop(self) -> None:
        # The store's last flush and tick run after the collectors stop: poll() must not wrap
        # again then (a stale wrapper would keep this agent alive and record for it).
        with self._lock:
            self._stopped = True
        try:
            if self._unsubscribe is not None:
                self._unsubscribe()
            if self._handle is not None:
                self._handle.remove()
                self._handle = None
            if self.loop is not None:
                self.loop.on_scale = self.loop.on_batch = None
            self.loss.uninstall()
            if self._acts is not None:
                self._acts.off()
            if self._root_hook is not None:
                self._root_hook.remove()
            if self._dl is not None:
                patches.restore(self._dl)
                self._dl = None
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
            if self._dl is None and (dl := imported("torch.utils.data.dataloader")) is not None:
                cls = dl._BaseDataLoaderIter
                orig = cls.__dict__.get("_next_index")
                if orig is not None:
                    self._dl = patches.replace(
                        cls, "_next_index", _keep_indices(orig), by="numerics",
                        why="keeps the sample indices of each batch, for a NaN's origin")
        try:
            self._find_model()
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
    def _on_batch(self, it: Any) -> None:
        q = it.__dict__.get("_probe_indices")
        ids = q.popleft() if q else None
        if len(self.batch_ids) < MAX_CALLS:
            self.batch_ids.append(ids)

    def _find_model(self) -> None:
        """Writer tick: when no tracer names the root model (PROBE_TRACE=off), find it once
        with one heap walk (heapscan.py: ~50-100 ms, once): the largest module whose trainable
        parameters the stepping optimizers hold. The training thread hooks it (_keep_root)."""
        tracer = self.tracer
        if self._root is not None or self._found is not None or not self.clock.seen_step or \
                getattr(tracer, "_first_root", None) is not None or \
                time.monotonic() - self._find_at < 30 or self._torch is None:
            return
        self._find_at = time.monotonic()
        wanted = {id(p) for o in self.clock.optimizers() for g in getattr(o, "param_groups", ())
                  for p in g["params"]}
        if not wanted:
            return
        from ..heapscan import live_objects

        mods = live_objects({"m": (self._torch.nn.Module,)})["m"]
        best, size = None, 0
        for m in mods:
            try:
                ps = [p for p in m.parameters() if p.requires_grad]
            except RuntimeError:
                continue
            if ps and len(ps) > size and all(id(p) in wanted for p in ps):
                best, size = unwrap(m), len(ps)
        self._found = best

    def _keep_root(self) -> None:
        """Hook the root model to keep each step's inputs (for a re-run) once it is known."""
        tracer = self.tracer
        root = getattr(tracer, "_first_root", None) or getattr(tracer, "root", None) or \
            self._found
        if root is None or root is self._root:
            return
        if self._root_hook is not None:
            self._root_hook.remove()
        self._root = root
        self._map = None
        torch = self._torch

        def keep(module: Any, args: Any, kwargs: Any) -> None:
            if torch.is_grad_enabled() and len(self.calls) < MAX_CALLS:
                self.calls.append((args, kwargs, _autocast(torch)))

        self._root_hook = root.register_forward_pre_hook(keep, with_kwargs=True)

    def module_map(self) -> ModuleMap | None:
        if self._root is None:
            return None
        model = unwrap(self._root)
        if self._map is None or self._map.model is not model:
            self._map = ModuleMap(model)
        return self._map

    def _on_opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
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
        try:
            self._check(optimizer)
        except Exception as e:  # noqa: BLE001 - inside optimizer.step(): counted
            self.guard.failed(e)

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
        if self._sharded is None:
            self._sharded = is_sharded(optimizer)
        rerun = True
        if self._sharded:  # FSDP2: the whole model's norm, and every rank knows of a NaN
            ready = self.first_nonfinite is None and self.module_map() is not None
            gf, nonfinite, rerun = agree(torch, lf, gf, clip_max is None,
                                         len(self.calls) if ready else 0)
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
            return norm, _float(loop.clip_max)
        with torch.no_grad():
            return total_norm(torch, optimizer), None

    def _spike(self, lf: float | None) -> float | None:
        """The factor over the recent median when this loss is a spike, else None."""
        if lf is None or not math.isfinite(lf) or len(self.recent) < 10:
            return None
        med = statistics.median(self.recent)
        if med <= 0:
            return None
        mad = statistics.median(abs(x - med) for x in self.recent) * 1.4826
        t = self.thresholds
        if lf > t["spike_factor"] * med and lf > med + t["spike_mads"] * mad:
            return lf / med
        return None

    def _anomaly(self, torch: Any, step: int | None, mm: ModuleMap | None,
                 spike: float | None, nonfinite: bool) -> None:
        now = time.time()
        samples = _samples_text(self.batch_ids)
        what = "nonfinite" if nonfinite else f"spike x{spike:.2f}"
        self._row(now, step, "(total)", "anomaly", note=what, samples=samples)
        if mm is None or not mm.params:
            return
        with torch.no_grad():
            norms = grad_norms(torch, mm.params)
        if norms is None:
            return
        vals = norms.tolist()
        i = 0
        for (name, _), n in zip(mm.groups, mm.sizes):
            g = math.sqrt(sum(x * x for x in vals[i:i + n]))
            i += n
            self._row(now, step, name, "anomaly", grad_norm=g,
                      grad_nonfinite=not math.isfinite(g))

    def _hunt(self, torch: Any, step: int | None, lf: float | None, gf: float | None,
              mm: ModuleMap | None, rerun: bool = True) -> None:
        info: dict[str, Any] = {"step": step, "loss": lf, "grad_norm": gf,
                                "loss_finite": lf is not None and math.isfinite(lf)}
        t0 = time.perf_counter()
        if mm is None:
            # "unchecked": no re-run happened (the CLI must not say it stayed finite)
            found: dict[str, Any] = {"stage": "unchecked", "note": "no root model seen yet (the "
                                     "tracer names it at the first step it wraps)"}
        elif not self.calls:
            found = {"stage": "unchecked", "note": "the step's model inputs were not kept"}
        elif not rerun:
            found = {"stage": "unchecked", "note": "FSDP2: not every rank had the step's "
                     "inputs and model at hand, and a re-run must run on all of them at once"}
        else:
            self.loss.paused = True
            try:
                found = hunt(torch, mm.model, self.calls, self.batch_ids, mm.modules,
                             collective=bool(self._sharded))
            except Exception as e:  # noqa: BLE001 - the re-run failed: say so, go on
                found = {"stage": "unchecked",
                         "note": f"re-run failed: {type(e).__name__}: {e}"}
            finally:
                self.loss.paused = False
        info.update(found)
        if mm is not None and found.get("module"):
            cls = next((type(m).__name__ for m_id, name in mm.modules.items()
                        if name == found["module"] for m in [_module_by_id(mm.model, m_id)]
                        if m is not None), None)
            info["module_class"] = cls
        info["rerun_ms"] = (time.perf_counter() - t0) * 1e3
        self.first_nonfinite = info
        self._row(time.time(), step, found.get("module") or "(none)", "origin",
                  stage=found.get("stage"), role=found.get("role"), op=found.get("op"),
                  samples=", ".join(str(s) for s in found.get("samples") or []) or None,
                  note=_origin_note(info))

    def _row(self, ts: float, step: int | None, module: str, kind: str, grad_norm: Any = None,
             weight_norm: Any = None, ratio: Any = None, act: Any = None,
             grad_nonfinite: Any = None, act_nonfinite: Any = None, clip_max: Any = None,
             stage: Any = None, role: Any = None, op: Any = None, samples: Any = None,
             note: Any = None) -> None:
        if len(self._held) < 10_000:
            self._held.append((ts, step, module, kind, grad_norm, weight_norm, ratio, act,
                              act_nonfinite, grad_nonfinite, clip_max, stage, role, op,
                              samples, note))

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
            self._row(ts, step, "(total)", "step", grad_norm=gf, grad_nonfinite=nonfinite,
                      clip_max=clip_max, note=f"spike x{spike:.2f}" if spike else None)
        stats, self._stats = self._stats, None
        if stats is not None:
            try:
                stats.after_step(torch)
                self._row(time.time(), step, "", "module-stats", note=stats)
            except Exception as e:  # noqa: BLE001 - training thread: counted
                self.guard.failed(e)
        held, self._held = self._held, []
        if len(self.rows) < BUFFER:
            self.rows.extend((r[0], step if r[1] is None else r[1], *r[2:]) for r in held)
        self.calls, self.batch_ids = [], []
        try:
            self._keep_root()
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
        n = len(self.rows)
        if not n or self.sink is None:
            return
        rows, self.rows[:n] = self.rows[:n], []
        out = []
        for r in rows:
            if r[3] == "module-stats":
                stats = r[-1]  # the StepStats rides in the note field until here
                for name, g, w, ratio, act in stats.rows():
                    out.append((r[0], r[1], name, "module", g, w, ratio, act,
                                act is not None and not math.isfinite(act),
                                g is not None and not math.isfinite(g),
                                None, None, None, None, None, None))
            else:
                out.append(r)
        cols = list(zip(*out))
        self.sink.append(TABLE, pa.table(
            [cols[0], [self.rank] * len(out), *cols[1:4],
             *[[_float(v) for v in c] for c in cols[4:8]], *cols[8:]], schema=self._schema))


def _module_by_id(model: Any, m_id: int) -> Any:
    return next((m for m in model.modules() if id(m) == m_id), None)


def _keep_indices(orig: Any) -> Any:
    @functools.wraps(orig)
    def _next_index(it: Any) -> Any:
        idx = orig(it)
        q = it.__dict__.get("_probe_indices")
        if q is None:
            q = it.__dict__["_probe_indices"] = collections.deque(maxlen=256)
        q.append(idx)
        return idx

    return _next_index


def _autocast(torch: Any) -> Any:
    for dev in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(dev):
                return dev, torch.get_autocast_dtype(dev)
        except (RuntimeError, TypeError):
            continue
    return None


def _samples_text(batch_ids: list[Any]) -> str | None:
    parts = []
    for i, ids in enumerate(batch_ids[:8]):
        if isinstance(ids, (list, tuple)):
            shown = ", ".join(str(x) for x in ids[:32]) + (", ..." if len(ids) > 32 else "")
            parts.append(f"batch {i}: [{shown}]")
        elif ids is not None:
            parts.append(f"batch {i}: {ids}")
    return "; ".join(parts) or None


def _origin_note(info: dict[str, Any]) -> str:
    bits = [f"loss {info.get('loss')}", f"grad norm {info.get('grad_norm')}"]
    if info.get("samples_are"):
        bits.append(f"samples are {info['samples_are']}")
    if info.get("micro_batch") is not None:
        bits.append(f"micro-batch {info['micro_batch']}")
    if info.get("note"):
        bits.append(str(info["note"]))
    bits.append(f"re-run {info.get('rerun_ms', 0):.0f} ms")
    return "; ".join(bits)


def _float(v: Any) -> float | None:
    if v is None:
        return None
    try:
        return float(v.item() if hasattr(v, "item") else v)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return math.nan


#: This collector, for the registry (registry.py): after the loop monitor (its GradScaler).
COLLECTOR = CollectorSpec(
    "numerics", 65, needs=("tracer", "trainloop"), tables=("python.numerics",),
    build=lambda b: NumericsRecorder(b.clock, b.rank, b.get("tracer"), b.get("trainloop")))
