"""The tracer's step boundaries: the optimizer step's own row, counting steps without an
optimizer, and setting up the next step.

``StepBoundaries`` runs once per ``optimizer.step()`` (the global optimizer pre/post hooks and
the step clock's subscriber) and once per root call (``root_called``), never per module call,
so it sits apart from the per-call state the hot path reads (``TorchTracer``'s ``step``,
``recording``, ``cuda``, ``in_backward``, ``root``, which it sets at a boundary). Also here:
what the step's root calls were fed (``pop_batch``, for throughput) and the parameters it
trained (``trained_params``, for the saved-bytes counter).
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any

from ..memory_kinds import trained_params
from .batch import StepBatch
from .trace_columns import FORWARD, OPT_STEP

if TYPE_CHECKING:
    from .tracer import TorchTracer

#: How long trained_params may reuse its list while nothing it can see cheaply changed.
PARAMS_MAX_AGE_S = 1.0
#: Without an optimizer step, the first FALLBACK_AFTER calls of the root model are step 1 (so
#: gradient accumulation in the first step is not split), then every call is one step (so an
#: inference loop still gets steps, which retention needs).
FALLBACK_AFTER = 16


class StepBoundaries:
    """What the tracer knows between steps; see the module docstring.

    Args:
        tracer: the tracer whose hot-path state a boundary sets up.
    """

    def __init__(self, tracer: TorchTracer) -> None:
        self.tracer = tracer
        self.fallback = True  # no optimizer step seen yet: root calls count steps
        self.optimizers: weakref.WeakSet[Any] | None = None  # the optimizers seen stepping
        self._batches: dict[int, StepBatch] = {}
        self._first_root: Any = None  # the fallback counts this root's calls only
        self._root_calls = 0
        self._pass_root: Any = None  # the first root called in this step: its calls are passes
        self._after_step = False  # an optimizer step was counted and no root call came since
        self._counted_opt = 0  # id() of the optimizer whose step the clock counted last
        self._prev_recording = False  # the finished step's recording and cuda
        self._prev_cuda = False
        self._opt_t0: dict[int, tuple[int, Any, int]] = {}  # id(opt) -> (t0, event, step)
        self._params_memo: tuple[Any, float, list[Any]] | None = None  # trained_params

    def start_after(self, step: int) -> None:
        """The step clock had counted ``step`` when the tracer armed: the next one is traced
        by its numbering, not by counting root calls."""
        self.fallback = False
        self.tracer.step = step + 1

    def root_called(self, module: Any, args: tuple[Any, ...], kwargs: Any) -> None:
        """A root call outside backward (``TorchTracer.on_root``, training thread)."""
        tr = self.tracer
        self._after_step = False
        if self.fallback:
            # Only calls of the first root seen count (a criterion module called at top
            # level is not a new step).
            if self._first_root is None:
                self._first_root = module
            if module is self._first_root:
                self._root_calls += 1
                if self._root_calls > FALLBACK_AFTER:
                    tr.step += 1
                    tr.recording = tr.traced(tr.step) and tr.guard.enabled
        saved = tr.saved
        if saved.pushed:
            if self._pass_root is None:
                self._pass_root = module
            elif module is self._pass_root:
                saved.new_pass()
        # Only calls that build a graph feed training: a validation pass under no_grad
        # inside the step (nanoGPT's every 250 steps) adds no tokens and no micro-batch.
        if tr.recording and tr.torch.is_grad_enabled():
            batch = self._batches.get(tr.step)
            if batch is None:
                batch = self._batches[tr.step] = StepBatch()
            batch.add(tr.torch, module, args, kwargs)

    def on_opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The global optimizer pre-hook: the step's row starts (when its step is traced)."""
        tr = self.tracer
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
                step, record = tr.step - 1, self._prev_recording
            else:
                step, record = tr.step, tr.recording
            if record:
                ev = tr.records.record_event() if tr.cuda or self._prev_cuda else None
                self._opt_t0[id(optimizer)] = (tr.clock(), ev, step)
        except Exception as e:  # noqa: BLE001 - inside optimizer.step()
            tr.failed(e)

    def on_opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The global optimizer post-hook: the step's row ends, into the records."""
        tr = self.tracer
        try:
            if self.optimizers is None:
                self.optimizers = weakref.WeakSet()
            self.optimizers.add(optimizer)
            start = self._opt_t0.pop(id(optimizer), None)
            if start is None:
                return
            t0, e0, step = start
            t1 = tr.clock()
            # When the step clock's hook ran before this one, the optimizer ended there: the
            # agent's boundary work after it is not the optimizer's (python.steps.agent_ms).
            b = tr.stepclock.last_step_ns
            if b is not None and t0 <= b < t1:
                t1 = b
            tr.records.add_step(optimizer, t0, t1, step, OPT_STEP, e0)
        except Exception as e:  # noqa: BLE001 - inside optimizer.step()
            tr.failed(e)

    def on_step(self, step: int, optimizer: Any) -> None:
        """StepClock subscriber (training thread): step ``step`` finished; set up the next."""
        tr = self.tracer
        if self.fallback:
            # Root calls before the first optimizer step were numbered by the fallback count
            # (a validation pass before training reaches "step 5"): not those steps' batches.
            self._batches.clear()
        self.fallback = False
        tr.step = step + 1
        tr.in_backward = FORWARD
        self._prev_recording, self._prev_cuda = tr.recording, tr.cuda
        self._after_step = True
        self._counted_opt = id(optimizer)
        tr.apply_mode(boundary=True)
        self._pass_root = None
        if tr.recording or tr.saved.pushed:
            tr.saved.switch(tr.torch, tr.recording and tr.guard.enabled, tr.step,
                            self.trained_params(optimizer))

    def trained_params(self, optimizer: Any = None) -> list[Any]:
        """The parameters of the last root model and of every optimizer seen (training
        thread): what memory_kinds.py counts and the saved-tensor counter leaves out. The walk
        costs ~1 us a parameter (0.1 ms for a 100-parameter model, 2% of a 5 ms step), so the
        list is kept while the root, the optimizers and their parameter counts stay the same,
        for at most PARAMS_MAX_AGE_S (a parameter added to the model alone shows after that)."""
        opts = (optimizer, *(self.optimizers or ()))
        tr = self.tracer
        root = tr.params_root if tr.params_root is not None else tr.root
        key = (id(root), *((id(o), _n_params(o)) for o in opts))
        now = time.monotonic()
        memo = self._params_memo
        if memo is not None and memo[0] == key and now - memo[1] < PARAMS_MAX_AGE_S:
            return memo[2]
        params = trained_params(root, opts)
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
