"""LoopMonitor: what the training loop does around the model -> ``python.step_stats``.

What gets captured
------------------
- **DataLoader wait**: ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__`` is wrapped
  (a class attribute, so iterators created before the agent armed are covered, whatever name the
  script imported ``DataLoader`` under). The time spent inside it between two optimizer steps is
  that step's ``data_wait``; a call that has not returned yet is the live "waiting for a batch
  since" that ``GET /v1/doctor`` reports (a stuck DataLoader).
- **Gradient clipping**: ``torch.nn.utils.clip_grad._clip_grads_with_norm_`` is wrapped. It is
  looked up as a module global by ``clip_grad_norm_`` at every call, so the wrapper sees every
  ``clip_grad_norm_`` call even when the script bound the function before the agent armed
  (``from torch.nn.utils import clip_grad_norm_``). It records ``max_norm`` and the total norm
  that ``clip_grad_norm_`` computed (the norm before clipping; NaN/Inf when a gradient is).
  Scripts that call ``get_total_norm``/``clip_grads_with_norm_`` themselves are not seen.
- **Clipping under AMP**: ``GradScaler.scale`` is wrapped (on the class) to learn the job's
  scaler. A ``clip_grad_norm_`` call made while that scaler is enabled and has not unscaled this
  iteration's gradients (no optimizer of it is in the ``UNSCALED`` stage) sees gradients times
  the scale (65536 at first): the clip then compares a norm 65536x too large with ``max_norm``,
  and every update shrinks. The scale is recorded with the norm (``grad_scale``), so doctor can
  say "clipping scaled gradients" and report the unscaled norm instead of blaming the LR.
- **Learning rate**: the primary optimizer's first param group's ``lr`` after each step.
- **Checkpoint and eval pauses**: seconds inside checkpoint saves and in ``model.eval()``
  intervals between two optimizer steps, on the training thread (pauses.py).
- **Gradient check on request**: ``request_grad_check()`` arms a one-shot check that runs right
  after the next optimizer step (gradients are complete and clipped then): one
  ``torch._foreach_norm`` over every gradient of every optimizer seen stepping. The norms are
  read on the requesting (HTTP) thread, so on CUDA the training thread never waits for them.

Cost
----
Per ``__next__``: two ``perf_counter`` calls and two float additions. Per step (StepClock
subscriber): one tuple append. Per ``clip_grad_norm_``: one attribute store (the norm tensor is
kept, not read; the writer thread converts it). The grad check costs one pass over the gradients,
once per request. Nothing here imports torch: wrappers are installed from the writer tick once
the program has imported the modules.
"""

from __future__ import annotations

import math
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from .. import patches
from . import Guard, Sink
from .pauses import PauseMeter
from .registry import CollectorSpec
from .torch_import import imported

if TYPE_CHECKING:
    from ..clock import StepClock

BUFFER = 100_000

TABLE = "python.step_stats"

_DL_MODULE = "torch.utils.data.dataloader"
_CLIP_MODULE = "torch.nn.utils.clip_grad"
_SCALER_MODULE = "torch.amp.grad_scaler"


class GradCheck:
    """One armed gradient check: ``done`` is set after the step that ran it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.step: int | None = None
        self.norms: Any = None  # a 1-D tensor of per-parameter grad norms, read by the asker
        self.params = 0
        self.without_grad = 0
        self.error: str | None = None


class LoopMonitor:
    """Collector for python.step_stats and the live loop state of ``GET /v1/doctor``.

    Args:
        clock: the agent's step clock: one row per step, and the optimizers whose gradients
            a check reads.
        rank: written into every row.
    """

    def __init__(self, clock: StepClock, rank: int) -> None:
        self.clock = clock
        self.rank = rank
        self.guard = Guard("training-loop monitor")
        self.rows: list[tuple[Any, ...]] = []
        self.sink: Sink | None = None
        self._schema: pa.Schema | None = None
        # Accumulated on the training thread since the last step (plain floats: no lock needed,
        # a torn read only shifts a few µs between two steps).
        self.data_wait = 0.0
        self.batches = 0
        self.waiting_since: float | None = None  # wall clock; a __next__ in progress
        self.clip_norm: Any = None
        self.clip_max: float | None = None
        self.clip_calls = 0
        self.clip_scale: Any = None  # the GradScaler's scale when the clip saw scaled gradients
        self.clip_total = 0
        self._scaler: weakref.ref[Any] | None = None  # the job's GradScaler, once it scaled
        #: called with (scaled output, loss given) by the GradScaler.scale wrapper (loss.py)
        self.on_scale: Any = None
        #: called with the iterator after each batch it hands out (numerics.py)
        self.on_batch: Any = None
        self._scaler_cls: Any = None
        self._scale_patch: patches.Patch | None = None
        self._pending: GradCheck | None = None
        self._dl_cls: Any = None
        self._dl_patch: patches.Patch | None = None
        self._clip_mod: Any = None
        self._clip_patch: patches.Patch | None = None
        self._unsubscribe: Any = None
        self._stopped = False
        self._install_lock = threading.Lock()  # writer tick and the first step both install
        self._first_step_seen = False
        self.pauses = PauseMeter()

    # -- collector protocol ------------------------------------------------------------------
    def start(self, sink: Sink) -> None:
        self.sink, self._schema = sink, sink.arrow_schema(TABLE)
        self._unsubscribe = self.clock.subscribe(self._on_step, "loop monitor")
        self.install()
        sink.add_flusher(self.flush)

    def stop(self) -> None:
        # The store's last flush runs after the collectors stop, and flush() installs: without
        # this flag the wrappers came back, and their closures kept the stopped agent (and its
        # DuckDB) alive for as long as the process ran.
        with self._install_lock:
            self._stopped = True
        try:
            if self._unsubscribe is not None:
                self._unsubscribe()
        finally:
            for patch in (self._dl_patch, self._clip_patch, self._scale_patch):
                patches.restore(patch)
            self._dl_cls = self._clip_mod = self._scaler_cls = None
            self.pauses.uninstall()
            pending, self._pending = self._pending, None
            if pending is not None:
                pending.error = "the agent stopped"
                pending.done.set()

    def install(self) -> None:
        """Wrap what the program has imported so far; cheap once both are wrapped."""
        with self._install_lock:
            if not self._stopped:
                self._install()

    def _install(self) -> None:
        self.pauses.install()
        if self._dl_cls is None and (dl := imported(_DL_MODULE)) is not None:
            cls = dl._BaseDataLoaderIter
            orig = cls.__dict__["__next__"]
            monitor = self

            def __next__(it: Any) -> Any:
                t0 = time.perf_counter()
                monitor.waiting_since = time.time()
                try:
                    batch = orig(it)
                finally:
                    monitor.waiting_since = None
                    monitor.data_wait += time.perf_counter() - t0
                    monitor.batches += 1
                if monitor.on_batch is not None:  # numerics.py: the batch's sample indices
                    monitor.on_batch(it)
                return batch

            __next__.__wrapped__ = orig  # type: ignore[attr-defined]
            self._dl_cls = cls
            self._dl_patch = patches.replace(
                cls, "__next__", __next__, by="loop monitor",
                why="times the DataLoader wait of each step (python.step_stats)")
        if self._clip_mod is None and (cg := imported(_CLIP_MODULE)) is not None:
            orig_clip = getattr(cg, "_clip_grads_with_norm_", None)
            if orig_clip is not None:
                monitor = self

                def _clip_grads_with_norm_(parameters: Any, max_norm: Any, total_norm: Any,
                                           *args: Any, **kwargs: Any) -> Any:
                    monitor.clip_norm, monitor.clip_max = total_norm, max_norm
                    monitor.clip_scale = monitor.pending_scale()
                    monitor.clip_calls += 1
                    return orig_clip(parameters, max_norm, total_norm, *args, **kwargs)

                _clip_grads_with_norm_.__wrapped__ = orig_clip  # type: ignore[attr-defined]
                self._clip_mod = cg
                self._clip_patch = patches.replace(
                    cg, "_clip_grads_with_norm_", _clip_grads_with_norm_, by="loop monitor",
                    why="reads the gradient norm and max_norm of each clip (doctor's LR check)")
        if self._scaler_cls is None and (gs := imported(_SCALER_MODULE)) is not None:
            scaler_cls = getattr(gs, "GradScaler", None)
            orig_scale = getattr(scaler_cls, "scale", None)
            if scaler_cls is not None and orig_scale is not None:
                monitor = self

                def scale(scaler: Any, outputs: Any) -> Any:
                    ref = monitor._scaler
                    if ref is None or ref() is not scaler:
                        monitor._scaler = weakref.ref(scaler)
                    result = orig_scale(scaler, outputs)
                    if monitor.on_scale is not None:  # the loss meter: what was scaled
                        monitor.on_scale(result, outputs)
                    return result

                scale.__wrapped__ = orig_scale  # type: ignore[attr-defined]
                self._scaler_cls = scaler_cls
                self._scale_patch = patches.replace(
                    scaler_cls, "scale", scale, by="loop monitor",
                    why="finds the job's GradScaler (its scale goes into checkpoints)")

    def scaler(self) -> Any:
        """The job's GradScaler (the last one seen scaling a loss), or None."""
        return self._scaler() if self._scaler is not None else None

    def pending_scale(self) -> Any:
        """The scaler's scale (a tensor copy: no device sync) when the gradients are still
        scaled, else None. Still scaled: the scaler is enabled and none of its optimizers has
        been unscaled since its last ``update()`` (which empties ``_per_optimizer_states``)."""
        if not self.guard.enabled:
            return None
        try:
            sc = self.scaler()
            if sc is None or not getattr(sc, "_enabled", False) or \
                    getattr(sc, "_scale", None) is None:
                return None
            states = getattr(sc, "_per_optimizer_states", {})
            if any(getattr(st.get("stage"), "name", "") == "UNSCALED" for st in states.values()):
                return None
            return sc._scale.detach().clone()
        except Exception as e:  # noqa: BLE001 - runs inside the job's clip_grad_norm_
            self.guard.failed(e)
            return None

    # -- training thread ---------------------------------------------------------------------
    def _on_step(self, step: int, optimizer: Any) -> None:
        if not self._first_step_seen:
            # The writer's tick installs too, but on a loaded machine it can come after the
            # second step: a checkpoint saved then went unseen (CI). By the first optimizer
            # step torch is imported, so from here every save and eval() is timed.
            self._first_step_seen = True
            self.install()
        groups = getattr(optimizer, "param_groups", None) or [{}]
        ckpt, evals = self.pauses.take()
        row = (time.time(), step, self.data_wait, self.batches, groups[0].get("lr"),
               self.clip_norm, self.clip_max, self.clip_calls, self.clip_scale, ckpt, evals)
        self.data_wait, self.batches = 0.0, 0
        self.clip_total += self.clip_calls
        self.clip_norm, self.clip_max, self.clip_calls, self.clip_scale = None, None, 0, None
        if len(self.rows) < BUFFER:
            self.rows.append(row)
        pending, self._pending = self._pending, None
        if pending is not None:
            self._check_grads(step, pending)

    def _check_grads(self, step: int, check: GradCheck) -> None:
        torch = sys.modules["torch"]
        try:
            params = [p for o in self.clock.optimizers()
                      for g in o.param_groups for p in g["params"]]
            grads = [p.grad for p in params if p.grad is not None]
            check.params, check.without_grad = len(params), len(params) - len(grads)
            if grads:
                with torch.no_grad():
                    check.norms = torch.stack(
                        [n.float() for n in torch._foreach_norm(grads)]).detach()
        except Exception as e:  # noqa: BLE001 - reported to the asker, never to training
            check.error = f"{type(e).__name__}: {e}"
        finally:
            check.step = step
            check.done.set()

    # -- HTTP threads ------------------------------------------------------------------------
    def request_grad_check(self, wait_s: float) -> dict[str, Any]:
        """Arm a gradient check for the next step and wait up to ``wait_s`` for it."""
        check = self._pending or GradCheck()
        self._pending = check
        if not check.done.wait(wait_s):
            return {"checked": False,
                    "reason": f"no optimizer step within {wait_s:g} s (is the rank stuck?)"}
        if check.error:
            return {"checked": False, "step": check.step, "reason": check.error}
        norms = [] if check.norms is None else [float(x) for x in check.norms.cpu().tolist()]
        bad = sum(1 for x in norms if not math.isfinite(x))
        finite = [x for x in norms if math.isfinite(x)]
        return {"checked": True, "step": check.step, "params": check.params,
                "without_grad": check.without_grad, "nonfinite": bad,
                "norm": math.sqrt(sum(x * x for x in finite)) if finite else None}

    def state(self) -> dict[str, Any]:
        since = self.waiting_since
        return {
            "dataloader_wrapped": self._dl_cls is not None,
            "clip_wrapped": self._clip_mod is not None,
            "data_waiting_s": round(time.time() - since, 3) if since is not None else None,
            "clip_calls_total": self.clip_total + self.clip_calls,
        }

    # -- writer thread -----------------------------------------------------------------------
    def flush(self) -> None:
        self.install()
        n = len(self.rows)
        if not n or self.sink is None:
            return
        rows, self.rows[:n] = self.rows[:n], []
        cols = list(zip(*rows))
        self.sink.append(TABLE, pa.table([
            cols[0], [self.rank] * n, cols[1], cols[2], cols[3], [_number(v) for v in cols[4]],
            [_number(v) for v in cols[5]], [_number(v) for v in cols[6]], cols[7],
            [_number(v) for v in cols[8]], cols[9], cols[10],
        ], schema=self._schema))


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return math.nan


def optimizer_state(optimizers: list[Any],
                    step_lrs: dict[int, list[Any]] | None = None) -> list[dict[str, Any]]:
    """Every optimizer's class and its param groups' scalar settings (lr, momentum, ...).

    ``step_lrs`` (the step clock's): each optimizer's LRs as its last step() used them. Where
    given, ``lr`` is that value, so ranks at the same step report the same LR whether or not
    their scheduler has stepped since (``lr_live`` keeps the value read now when it differs).
    """
    out = []
    for i, opt in enumerate(optimizers):
        groups = []
        used = (step_lrs or {}).get(id(opt)) or []
        for j, g in enumerate(getattr(opt, "param_groups", ())):
            settings: dict[str, Any] = {"params": len(g.get("params", ()))}
            for k, v in g.items():
                if k == "params":
                    continue
                v = v.item() if hasattr(v, "item") and getattr(v, "numel", lambda: 2)() == 1 \
                    else v
                if isinstance(v, (bool, int, float, str)) or v is None:
                    settings[k] = v
                elif isinstance(v, tuple) and all(isinstance(x, (int, float)) for x in v):
                    settings[k] = list(v)
            at_step = used[j] if j < len(used) else None
            if at_step is not None and "lr" in settings:
                if settings["lr"] != at_step:
                    settings["lr_live"] = settings["lr"]
                settings["lr"] = at_step
            groups.append(settings)
        out.append({"index": i, "class": type(opt).__name__, "groups": groups})
    return out


#: This collector, for the registry (registry.py).
COLLECTOR = CollectorSpec("trainloop", 60, lambda b: LoopMonitor(b.clock, b.rank),
                          tables=("python.step_stats",))
