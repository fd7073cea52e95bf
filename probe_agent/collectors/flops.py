"""FlopMeter: the model FLOPs of one whole optimizer step, measured with torch's own counter.

What gets measured
------------------
``torch.utils.flop_counter.FlopCounterMode``'s dispatch mode is entered at a step boundary (right
after optimizer step N, on the training thread) and left at the next one, so it sees every op of
step N+1: the forward and backward of every micro-batch. It counts the ops torch has formulas
for (matmuls, convolutions, attention), which is what "model FLOPs" means for MFU; the
optimizer's elementwise updates are not counted. Counted per rank: under DDP each rank's own
micro-batches; under FSDP each rank's compute (the sharding changes memory, not the math).

When
----
- Once, at the first boundary where the next step is traced (so that its tokens, from the
  tracer's view of the root call, belong to the very step measured), or at once when tracing is
  off.
- Again when the token input shapes change (a new sequence length or batch size), at most once
  every ``MIN_GAP`` steps, so that variable-length batches cannot make every step a measured one.
- The measured step is slower (every op goes through a Python dispatch mode); its row in
  python.steps says ``flops_measured`` and its duration is that cost (bench/flops_cost.py).

Never
-----
- When another dispatch mode is active at the boundary (a user's FlopCounterMode, a debug
  mode): the meter's exit pops the top of the mode stack, so it must be the one it pushed.
- With torch.compile in the process (compiled frames): under a dispatch mode they recompile or
  run eagerly, so the step measured would not be the job's. FLOPs stay NULL, 6N remains.
- After a failure (a Guard counts it; repeated failures switch the meter off).

torch.compile first called inside the measured step
---------------------------------------------------
Dynamo does not compile a frame while a dispatch mode is on the stack, and it remembers that:
the frame then runs eagerly for the rest of the process (seen: a function compiled after a
first eager step never compiled, with the agent's tracing off). So the meter's mode says
``ignore_compile_internals``: dynamo compiles as if it were not there, and switches it off
while it compiles. A step in which the first compiled frame appeared is not a measurement
(inductor's kernels are not ops the counter sees): it is dropped, and the meter stops, as for
a job compiled from the start.

The agent stopping while a step is measured
-------------------------------------------
The mode is on the training thread's own dispatch stack: ``release`` leaves it there and then,
or at that thread's next optimizer step (optim_hooks.on_thread). Left on, every later compiled
frame of the process would run eagerly.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

from .. import optim_hooks
from . import Guard
from .tracer.saved_bytes import compiled_here

log = logging.getLogger(__name__)

#: Steps between two measurements triggered by new input shapes.
MIN_GAP = 50


class FlopMeter:
    """Measures one step's FLOPs at a time; ``boundary`` drives it from the step recorder."""

    def __init__(self) -> None:
        self.guard = Guard("flop meter")
        self.flops: float | None = None  # FLOPs of the last measured step
        self.tokens: int | None = None  # its tokens, when known
        self.measured_step: int | None = None
        self.measurements = 0
        self.skipped: str | None = None  # why no measurement is taken
        self._mode: Any = None
        self._counter: Any = None  # the FlopCounterMode whose dispatch mode is entered
        self._step: int | None = None  # the step the active mode measures
        self._shapes: Any = None  # token input shapes of the measured step
        self._want = True
        self._thread: int | None = None  # the thread whose dispatch stack holds the mode
        self._stopped = False
        #: the measured step's work per module: [(name or None, flops, ops, op_ms)]
        self.by_module: list[tuple[str | None, float, int, float]] = []

    @property
    def measuring(self) -> bool:
        """A step is being counted now: any op run on this thread lands in its FLOPs."""
        return self._mode is not None

    def boundary(self, torch: Any, step: int, shapes: Any, next_traced: bool,
                 tracing: bool) -> float | None:
        """Step ``step`` just finished (training thread). Returns its FLOPs when it was the
        measured step; starts measuring the next step when a measurement is due.

        Args:
            shapes: the token input shapes of ``step`` when it was traced, else None.
            next_traced: the tracer will trace step ``step + 1`` (its tokens will be known).
            tracing: the tracer traces some steps at all (else measure without waiting).
        """
        if not self.guard.enabled or self._stopped:
            return None
        out = None
        try:
            if self._mode is not None:
                out = self._finish(torch, step, shapes)
            elif (shapes and self._shapes is not None and shapes != self._shapes
                  and (self.measured_step is None or step - self.measured_step >= MIN_GAP)):
                self._want = True
            if self._want and (next_traced or not tracing):
                self._begin(torch, step + 1)
        except Exception as e:  # noqa: BLE001 - training thread: counted, never raised
            self._mode = None
            self.guard.failed(e)
        return out

    def _begin(self, torch: Any, step: int) -> None:
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if _get_current_dispatch_mode() is not None:
            return  # someone else's mode is on the stack: try again at the next boundary
        if compiled_here():
            # A dispatch mode makes compiled frames recompile or run eagerly: the step
            # measured would not be the job's step. flops stay NULL; flops_6n remains.
            self.skipped = "torch.compile in the process"
            return
        # Only the dispatch mode, not FlopCounterMode.__enter__: that also enters a
        # ModuleTracker, i.e. global module hooks for the whole step (torch.compile warns about
        # them, and every module call takes the slow path). Without it every count lands in
        # the counter's "Global" total, which is all we read.
        counter = _module_counter()(display=False)
        mode = _compile_safe_mode()(counter)
        mode.__enter__()
        self._mode, self._counter, self._step, self._want = mode, counter, step, False
        self._thread = threading.get_ident()

    def _finish(self, torch: Any, step: int, shapes: Any) -> float | None:
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        mode, self._mode = self._mode, None
        if _get_current_dispatch_mode() is not mode:
            # The job left a mode of its own on top: popping now would pop the job's.
            raise RuntimeError("another dispatch mode is on top of the FLOP counter")
        if mode is None:
            return None  # not counting (released by stop() from another thread meanwhile)
        mode.__exit__(None, None, None)
        if compiled_here():
            # torch.compile compiled its first frames in this very step: not a measurement
            self.skipped = "torch.compile in the process"
            self._stopped = True
            return None
        if step != self._step:
            return None  # a step the clock counted differently (skipped by a scaler, ...)
        self.flops = float(self._counter.get_total_flops())
        self.measured_step = step
        self.measurements += 1
        self.by_module = self._counter.by_module(torch)
        if shapes:
            self._shapes = shapes
        return self.flops

    def release(self) -> None:
        """The agent stops: no more measurements, and a mode still entered leaves the training
        thread's dispatch stack (now, or at that thread's next optimizer step)."""
        self._stopped = True
        entered = self._mode
        if entered is None:
            return

        def leave() -> None:
            from torch.utils._python_dispatch import _get_current_dispatch_mode

            # Any: an `is` against torch's Optional return type would widen `entered` again
            on_top: Any = _get_current_dispatch_mode()
            if self._mode is entered and on_top is entered:
                self._mode = None
                entered.__exit__(None, None, None)

        optim_hooks.on_thread(sys.modules["torch.optim.optimizer"], self._thread, leave)

    def state(self) -> dict[str, Any]:
        return {"flops": self.flops, "measured_step": self.measured_step,
                "measurements": self.measurements, "measuring": self._mode is not None,
                "skipped": self.skipped,
                "failures": self.guard.failures, "disabled": not self.guard.enabled}


_SAFE_MODE: Any = None
_MODULE_COUNTER: Any = None


def _compile_safe_mode() -> Any:
    """torch's ``_FlopCounterMode`` that dynamo compiles under (see the module docstring),
    which also times each op and tells the counter whose forward it runs in (module_work.py)."""
    global _SAFE_MODE
    if _SAFE_MODE is None:
        from torch.utils.flop_counter import _FlopCounterMode

        from .module_work import timed_dispatch

        class CompileSafeFlopCounterMode(_FlopCounterMode):
            @classmethod
            def ignore_compile_internals(cls) -> bool:
                return True

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                                   kwargs: Any = None) -> Any:
                return timed_dispatch(self, super().__torch_dispatch__, func, types, args,
                                      kwargs)

        _SAFE_MODE = CompileSafeFlopCounterMode
    return _SAFE_MODE


def _module_counter() -> Any:
    """``FlopCounterMode`` that also keeps FLOPs, ops and op time per module."""
    global _MODULE_COUNTER
    if _MODULE_COUNTER is None:
        from .module_work import module_counter_class

        _MODULE_COUNTER = module_counter_class()
    return _MODULE_COUNTER


def trainable_params(params: list[Any]) -> int:
    """N of 6·N·tokens: the elements of the parameters being trained (each tensor once; a
    DTensor's numel is its global size, so FSDP shards count whole)."""
    seen: set[int] = set()
    n = 0
    for p in params:
        if id(p) in seen or not getattr(p, "requires_grad", False):
            continue
        seen.add(id(p))
        n += int(p.numel())
    return n
