"""StepClock: the agent's single source of truth for "which training step is this rank at".

NOTE for every feature that needs step numbers or step boundaries (the torch tracer,
the step-boundary actions, ...): use ``agent.stepclock`` — ``current_step`` for the
number and ``subscribe(fn)`` for "run this on the training thread right after the step". Do not
register another global optimizer hook that counts on its own: two counters drift apart (one
arms later, one counts every optimizer), and then "step 40" means two different things in one
agent's tables and actions.

How it works
------------
- One global ``torch.optim.optimizer.register_optimizer_step_post_hook``. It fires after
  ``step()`` of every ``torch.optim.Optimizer`` in the process, on the thread that called it (the
  training thread).
- The clock arms lazily: the agent may start before the program imports torch (PROBE=1 starts it
  from a ``.pth`` file), and it must never import torch itself. ``poll()`` runs on the writer
  tick (PROBE_FLUSH_MS) and on every step-related request; it arms once ``torch.optim.optimizer``
  is fully imported.
- A step is counted when the *primary* optimizer (the first one seen stepping) finishes its step,
  so a job with two optimizers (a GAN, or one per parameter subset) counts one step per
  iteration. If the primary optimizer is garbage-collected, the next one seen stepping takes over
  and the count continues.
- Numbering: at the first step it sees, the clock takes the optimizer's own count when it keeps
  one (the Adam family's ``state[p]["step"]``, which a resumed run restores), so ranks whose
  agents armed at different times (``probe inject`` after start) still agree. Otherwise it counts
  from 1 at the first step seen. Step N means "the N-th optimizer step has finished";
  ``current_step`` is 0 before the first.
- Every optimizer seen stepping is kept in a WeakSet-like ordered list (``optimizers()``), the
  robust way to find a job's optimizers without knowing its variable names.
- Subscribers run on the training thread right after each counted step, in subscription order.
  Each has its own ``collectors.Guard``: a failure is counted and logged once, and after repeated
  failures that subscriber is switched off. Training never sees the exception.
- Steps the AMP grad scaler skips count too. ``GradScaler.step(optimizer)`` does not
  call ``optimizer.step()`` when the gradients hold inf/NaN (fp16 training skips several steps
  at its start while the scale settles), yet the HF Trainer's ``state.global_step`` and
  Lightning's ``global_step`` count that step. So the clock wraps ``GradScaler.step`` (on the
  class: Accelerate's, Lightning's and FSDP's ShardedGradScaler all use it) and counts a call
  that did not reach the optimizer as a skipped step; ``state()["skipped"]`` says how many.
  Wrappers over the optimizer (Accelerate's ``AcceleratedOptimizer``, ``LightningOptimizer``)
  never fire the hook themselves, so one optimizer step is never counted twice.
- Under DeepSpeed a step ends when ``engine.step()`` returns, not when the torch optimizer
  inside it does: after the hook fires, the ZeRO optimizer still copies the updated partitions
  back into the model's parameters, and the engine then steps its LR scheduler and advances
  ``global_steps``. A checkpoint taken at the hook saved step N-1's weights with step N's
  optimizer state, and ``eval --next-step "engine.global_steps"`` read N-1. So the clock wraps
  ``DeepSpeedEngine.step`` and ``_take_model_step`` (on the class; PipelineEngine reaches only
  the second): inside them the hook only notes which optimizer stepped, and the step is counted
  when the outermost of them returns having advanced ``global_steps`` (only the micro step that
  ends a gradient accumulation does). One that advanced it without the torch optimizer
  stepping (fp16 overflow) counts as a skipped step, as GradScaler's do. The wrap is put in
  place on the writer tick once the program imported ``deepspeed.runtime.engine`` (long before
  its first step: ``deepspeed.initialize`` takes seconds); a hook call that finds DeepSpeed
  imported and not wrapped yet wraps it then and counts that one step at the hook.
- Optimizers that are not ``torch.optim.Optimizer`` subclasses (a hand-written update loop,
  some fused third-party optimizers) never fire the hook: then ``seen_step`` stays False and
  step-bound features must refuse and say so.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from . import optim_hooks, patches
from .collectors import Guard, Sink
from .collectors.torch_import import imported

log = logging.getLogger(__name__)

#: A subscriber gets the step number that just finished and the optimizer that finished it.
StepCallback = Callable[[int, Any], None]


class StepClock:
    """Counts training steps from the global optimizer step hook; see the module docstring."""

    def __init__(self) -> None:
        self.current_step = 0
        self.seen_step = False
        self.armed = False
        self.armed_at: float | None = None
        self.last_step_at: float | None = None
        self.last_step_ns: int | None = None
        #: The last finished step boundary: when its subscribers started and when they were all
        #: done. The agent's own work there (recorders, scheduled reads, actions) is not the
        #: job's: the step recorder starts the next step when it ended, and reports it apart.
        self.boundary: tuple[float, float] | None = None
        self.training_thread: int | None = None
        self.numbering = "counted"  # or "optimizer-state" when seeded from Adam's step
        self._primary: weakref.ref[Any] | None = None
        self._optimizers: list[weakref.ref[Any]] = []
        self._seen_ids: set[int] = set()
        self._subscribers: list[tuple[StepCallback, Guard]] = []
        self._handle: Any = None
        self._lock = threading.Lock()
        self.skipped = 0
        #: Hook calls so far, for any optimizer: the scaler wrapper's "did it step?"
        self._hook_calls = 0
        self._scaler_step: patches.Patch | None = None  # GradScaler.step while wrapped
        #: each DeepSpeed engine method wrapped (the ledger's records, patches.py)
        self._engine_steps: list[patches.Patch] = []
        self._engine_depth = 0  # engine.step() calls in progress on the training thread
        self._engine_thread: int | None = None
        self._deferred: Any = None  # the optimizer that stepped inside engine.step()
        #: id(optimizer) -> its param groups' LRs as its last step() used them. A scheduler
        #: steps after the optimizer (the HF Trainer: ``optimizer.step()``, then
        #: ``lr_scheduler.step()``), so a live read at step N may hold step N's or step N+1's
        #: LR; two ranks at the same step then "disagree". Doctor reports these instead.
        self.step_lrs: dict[int, list[Any]] = {}

    # -- collector protocol ------------------------------------------------------------------
    def start(self, sink: Sink) -> None:
        self.poll()
        if not self.armed:
            sink.add_ticker(self.poll)

    def stop(self) -> None:
        handle, self._handle = self._handle, None
        try:
            if handle is not None:
                handle.remove()
            wrapped, self._scaler_step = self._scaler_step, None
            patches.restore(wrapped)
            engines, self._engine_steps = self._engine_steps, []
            for patch in engines:
                patches.restore(patch)
        finally:
            self.armed = False

    # -- arming ------------------------------------------------------------------------------
    @staticmethod
    def torch_ready() -> bool:
        """True once the program has fully imported torch.optim.optimizer (never imports it)."""
        mod = imported("torch.optim.optimizer")
        return mod is not None and hasattr(mod, "register_optimizer_step_post_hook")

    def poll(self) -> bool:
        """Arm if torch is ready; cheap after that. Returns whether the clock is armed."""
        if self.armed:
            if not self._engine_steps:
                self._wrap_engine_step()
            return True
        if not self.torch_ready():
            return False
        with self._lock:
            if not self.armed:
                mod = sys.modules["torch.optim.optimizer"]
                # copy-on-write: a step in progress on the training thread is iterating it
                self._handle = optim_hooks.register(mod, "post", self._on_step)
                self._wrap_grad_scaler()
                self._wrap_engine_step()
                self.armed = True
                self.armed_at = time.time()
        return True

    def _wrap_grad_scaler(self) -> None:
        """Count the steps ``GradScaler.step`` skips (see the module docstring)."""
        mod = imported("torch.amp.grad_scaler")
        cls = getattr(mod, "GradScaler", None)
        original = getattr(cls, "step", None)
        if cls is None or original is None or patches.ours(original) is not None:
            return  # no AMP scaler in this torch, or another clock of this process wraps it
        clock = self

        @functools.wraps(original)
        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = clock._hook_calls
            result = original(scaler, optimizer, *args, **kwargs)
            if clock._hook_calls == before and clock.armed:
                clock._on_step(optimizer, args, kwargs, skipped=True)
            return result

        self._scaler_step = patches.replace(
            cls, "step", step, by="step clock",
            why="counts the optimizer steps GradScaler skips (inf/NaN gradients)")

    def _wrap_engine_step(self) -> None:
        """End DeepSpeed's steps where the engine does (see the module docstring)."""
        mod = imported("deepspeed.runtime.engine")
        cls = getattr(mod, "DeepSpeedEngine", None)
        if cls is None:
            return
        for name in ("step", "_take_model_step"):
            original = cls.__dict__.get(name)
            if original is None or patches.ours(original) is not None:
                continue
            self._engine_steps.append(patches.replace(
                cls, name, _engine_step_wrapper(self, original), by="step clock",
                why="ends DeepSpeed's steps where the engine does (accumulation boundaries)"))

    # -- what others use ---------------------------------------------------------------------
    def subscribe(self, fn: StepCallback, name: str | None = None) -> Callable[[], None]:
        """Run ``fn(step, optimizer)`` on the training thread after every counted step.

        Args:
            fn: must be quick; it holds the training thread. Its exceptions are counted and
                logged once, and after 10 failures it is not called again.
            name: shown in the warning when ``fn`` fails.

        Returns:
            A function that unsubscribes ``fn``.
        """
        entry = (fn, Guard(f"step subscriber {name or getattr(fn, '__qualname__', fn)}"))
        with self._lock:
            self._subscribers = [*self._subscribers, entry]

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = [e for e in self._subscribers if e is not entry]

        return unsubscribe

    def optimizers(self) -> list[Any]:
        """Every live optimizer seen stepping, in the order first seen (primary first)."""
        return [o for o in (r() for r in self._optimizers) if o is not None]

    def state(self) -> dict[str, Any]:
        return {
            "step": self.current_step if self.seen_step else None,
            "seen_step": self.seen_step,
            "armed": self.armed,
            "torch": "torch" in sys.modules,
            "numbering": self.numbering,
            "armed_at": self.armed_at,
            "last_step_at": self.last_step_at,
            "optimizers": [type(o).__name__ for o in self.optimizers()],
            "skipped": self.skipped,
        }

    # -- the hook (training thread) ----------------------------------------------------------
    def _on_step(self, optimizer: Any, args: Any, kwargs: Any, skipped: bool = False) -> None:
        # Failures here must never reach optimizer.step(): this is a hook on the training thread.
        self._hook_calls += 1
        if self._engine_depth and not skipped and self._engine_thread == threading.get_ident():
            if self._deferred is None:  # counted when engine.step() returns
                self._deferred = optimizer
            return
        try:
            if not self._engine_steps and "deepspeed.runtime.engine" in sys.modules:
                self._wrap_engine_step()  # the next steps end where the engine's do
            if id(optimizer) not in self._seen_ids:
                self._remember(optimizer)
            self.step_lrs[id(optimizer)] = [_plain_lr(g.get("lr"))
                                            for g in getattr(optimizer, "param_groups", ())]
            primary = self._primary() if self._primary is not None else None
            if primary is None:
                self._primary = weakref.ref(optimizer)
                primary = optimizer
            if optimizer is not primary:
                return
            if skipped:
                self.skipped += 1
            if not self.seen_step:
                seeded = None if skipped else _optimizer_step_count(optimizer)
                if seeded is not None:
                    self.numbering = "optimizer-state"
                self.current_step = seeded if seeded is not None else self.current_step + 1
                self.seen_step = True
            else:
                self.current_step += 1
            self.last_step_at = time.time()
            self.last_step_ns = time.perf_counter_ns()  # the tracer's clock, same moment
            self.training_thread = threading.get_ident()
        except Exception as e:  # never into the training thread (see module docstring)
            log.warning("probe agent: step clock failed: %s", e)
            return
        step = self.current_step
        at = self.last_step_at
        for fn, guard in self._subscribers:
            if not guard.enabled:
                continue
            try:
                fn(step, optimizer)
            except Exception as e:  # the subscriber's own bug; counted, training continues
                guard.failed(e)
        if at is not None:
            self.boundary = (at, time.time())

    def _remember(self, optimizer: Any) -> None:
        oid = id(optimizer)

        def forget(_: Any, oid: int = oid) -> None:
            self._seen_ids.discard(oid)
            self.step_lrs.pop(oid, None)
            self._optimizers = [r for r in self._optimizers if r() is not None]

        self._optimizers.append(weakref.ref(optimizer, forget))
        self._seen_ids.add(oid)


def _plain_lr(value: Any) -> float | None:
    """A plain number LR, or None for a tensor LR (reading it could sync a device: the live
    value is reported for it instead)."""
    return float(value) if isinstance(value, (int, float)) else None


def _engine_step_wrapper(clock: StepClock, original: Any) -> Any:
    """``DeepSpeedEngine.step`` (or ``_take_model_step``) that counts the step when it returns
    having advanced ``global_steps``; a nested one (step -> _take_model_step) passes through."""

    @functools.wraps(original)
    def wrapped(engine: Any, *args: Any, **kwargs: Any) -> Any:
        if clock._engine_depth and clock._engine_thread == threading.get_ident():
            return original(engine, *args, **kwargs)
        before = getattr(engine, "global_steps", None)
        clock._engine_depth, clock._engine_thread = 1, threading.get_ident()
        clock._deferred = None
        try:
            result = original(engine, *args, **kwargs)
        finally:
            clock._engine_depth = 0
        stepped, clock._deferred = clock._deferred, None
        if clock.armed and getattr(engine, "global_steps", None) != before:
            opt = stepped if stepped is not None else _torch_optimizer(engine)
            if opt is not None:
                clock._on_step(opt, args, kwargs, skipped=stepped is None)
        return result

    return wrapped


def _torch_optimizer(engine: Any) -> Any:
    """The torch optimizer inside a DeepSpeed engine's ZeRO optimizer (wrappers keep it as
    ``.optimizer``), or None without one."""
    opt = getattr(engine, "optimizer", None)
    for _ in range(4):
        inner = getattr(opt, "__dict__", {}).get("optimizer")
        if inner is None or not hasattr(inner, "param_groups"):
            break
        opt = inner
    return opt


def _optimizer_step_count(optimizer: Any) -> int | None:
    """The optimizer's own step count when it keeps one (Adam family), else None."""
    best: int | None = None
    for state in getattr(optimizer, "state", {}).values():
        step = state.get("step") if isinstance(state, dict) else None
        if step is None:
            continue
        try:
            value = int(step.item() if hasattr(step, "item") else step)
        except (TypeError, ValueError, RuntimeError):
            continue
        best = value if best is None else max(best, value)
    return best

