"""The tracer's step boundaries: the optimizer step's own row, and setting up the next step.

Mixed into ``TorchTracer`` (tracer.py), whose state it reads and writes. It runs once per
``optimizer.step()`` (the global optimizer pre/post hooks and the step clock's subscriber), never
per module call, so it sits apart from the per-call state and wrapper control that tracer.py
keeps: what happens between two steps is read here, what happens inside one is read there (and
in trace_hot.py). Also here: what the step's root calls were fed (``pop_batch``, for
throughput) and the parameters it trained (``trained_params``, for the saved-bytes counter).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from ..memory_kinds import trained_params
from .batch import StepBatch
from .trace_columns import FORWARD, FW_MAX, OPT_STEP, pack_fw

#: How long trained_params may reuse its list while nothing it can see cheaply changed.
PARAMS_MAX_AGE_S = 1.0


class StepBoundaries:
    """Mixed into ``TorchTracer``; see the module docstring."""

    stepclock: Any  # StepClock (clock.py)
    clock: Callable[[], int]
    step: int
    recording: bool
    cuda: bool
    fallback: bool
    in_backward: int
    root: Any
    saved: Any  # SavedBytes (saved_bytes.py)
    guard: Any  # Guard (collectors/__init__.py)
    optimizers: Any
    fw: Any
    objs: list[Any]
    roots: list[Any]
    fcuda: list[Any]
    mode: str
    _torch: Any
    _batches: dict[int, StepBatch]
    _after_step: bool
    _counted_opt: int
    _prev_recording: bool
    _prev_cuda: bool
    _pass_root: Any
    _opt_t0: dict[int, tuple[int, Any, int]]
    _params_memo: tuple[Any, float, list[Any]] | None
    failed: Callable[[BaseException], None]  # tracer.py
    _apply: Callable[[str, bool], None]  # tracer.py
    record_event: Callable[[], Any]  # trace_cuda.py
    memory: Callable[[], Any]  # trace_cuda.py

    def _on_opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            # A second optimizer stepping right after the counted one (no root call between)
            # belongs to the step that just finished, not to the next one.
            # A step() given a closure (Lightning, LBFGS) runs the model itself: it is the
            # step being computed even though no root call came before it.
            # (args is what step() got, self first)
            # The optimizer just counted stepping again is the next step, never the finished
            # one: on untraced steps the root wrapper is off, so no root call resets
            # _after_step (an HF Trainer's every-10th traced step got the next step's AdamW row).
            closure = (kwargs or {}).get("closure") or (args[1] if len(args) > 1 else None)
            if self._after_step and closure is None and id(optimizer) != self._counted_opt:
                step, record = self.step - 1, self._prev_recording
            else:
                step, record = self.step, self.recording
            if record:
                ev = self.record_event() if self.cuda or self._prev_cuda else None
                self._opt_t0[id(optimizer)] = (self.clock(), ev, step)
        except Exception as e:  # noqa: BLE001 - inside optimizer.step()
            self.failed(e)

    def _on_opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if self.optimizers is None:
                self.optimizers = weakref.WeakSet()
            self.optimizers.add(optimizer)
            start = self._opt_t0.pop(id(optimizer), None)
            if start is None:
                return
            t0, e0, step = start
            t1 = self.clock()
            # When the step clock's hook ran before this one, the optimizer ended there: the
            # agent's boundary work after it is not the optimizer's (python.steps.agent_ms).
            b = self.stepclock.last_step_ns
            if b is not None and t0 <= b < t1:
                t1 = b
            if len(self.fw) < FW_MAX:
                self.objs.append(optimizer)
                self.roots.append(None)
                cuda = 0
                if e0 is not None:
                    self.fcuda.append((e0, self.record_event(), self.memory()))
                    cuda = 1
                self.fw.frombytes(pack_fw(t0, t1, step, OPT_STEP, 0, -1, cuda))
        except Exception as e:  # noqa: BLE001 - inside optimizer.step()
            self.failed(e)

    def _on_step(self, step: int, optimizer: Any) -> None:
        """StepClock subscriber (training thread): step ``step`` finished; set up the next."""
        if self.fallback:
            # Root calls before the first optimizer step were numbered by the fallback count
            # (a validation pass before training reaches "step 5"): not those steps' batches.
            self._batches.clear()
        self.fallback = False
        self.step = step + 1
        self.in_backward = FORWARD
        self._prev_recording, self._prev_cuda = self.recording, self.cuda
        self._after_step = True
        self._counted_opt = id(optimizer)
        self._apply(self.mode, True)  # boundary=True
        self._pass_root = None
        if self.recording or self.saved.pushed:
            self.saved.switch(self._torch, self.recording and self.guard.enabled, self.step,
                              self.trained_params(optimizer))

    def trained_params(self, optimizer: Any = None) -> list[Any]:
        """The parameters of the last root model and of every optimizer seen (training
        thread): what memory_kinds.py counts and the saved-tensor counter leaves out. The walk
        costs ~1 us a parameter (0.1 ms for a 100-parameter model, 2% of a 5 ms step), so the
        list is kept while the root, the optimizers and their parameter counts stay the same,
        for at most PARAMS_MAX_AGE_S (a parameter added to the model alone shows after that)."""
        opts = (optimizer, *(self.optimizers or ()))
        key = (id(self.root), *((id(o), _n_params(o)) for o in opts))
        now = time.monotonic()
        memo = self._params_memo
        if memo is not None and memo[0] == key and now - memo[1] < PARAMS_MAX_AGE_S:
            return memo[2]
        params = trained_params(self.root, opts)
        self._params_memo = (key, now, params)
        return params

    def pop_batch(self, step: int) -> StepBatch | None:
        """What the root calls of traced step ``step`` were fed (batch.py), once; older
        entries are dropped."""
        b = self._batches.pop(step, None)
        for old in [s for s in self._batches if s < step]:
            del self._batches[old]
        return b


def _n_params(optimizer: Any) -> int:
    """The optimizer's parameter count (its param groups'), -1 for None."""
    if optimizer is None:
        return -1
    return sum(len(g.get("params", ())) for g in getattr(optimizer, "param_groups", ()) or ())
