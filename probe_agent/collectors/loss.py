"""LossMeter: each optimizer step's loss, with no line of code in the training script.

What is recorded (``python.steps.loss``)
----------------------------------------
The value ``backward()`` was called on, as the script itself would print it for the step:
- **Plain loops**: ``torch.autograd.backward`` is wrapped (``loss.backward()`` calls it through
  the module attribute, so both spellings are seen). A call on one scalar tensor with no
  explicit ``gradient`` is a loss; anything else (a pipeline stage's activations with their
  incoming gradient) is not.
- **GradScaler**: ``scaler.scale(loss).backward()`` runs backward on ``loss x scale``. The
  scaler's ``scale`` is already wrapped by the loop monitor (trainloop.py), which tells this
  meter the pair (what it returned, what it was given): the unscaled loss is recorded.
- **Gradient accumulation**: a script that divides each micro-batch's loss by the number of
  micro-batches (``loss / accum``, or ``loss * (1 / accum)``) sums them, as nanoGPT's
  ``loss_accum += loss.detach()``: then the step's loss is the sum of the values backward()
  got. The division is read off the tensor's ``grad_fn`` (``DivBackward0``/``MulBackward0``
  with a constant ``_saved_other`` equal to the number of micro-batches of that step, or its
  inverse). A script that does not divide gets the mean of its micro-batches' losses.
- **Frameworks report their own**: the HF Trainer's ``training_step`` return value (summed
  over the step's micro-batches, exactly as the Trainer's ``tr_loss`` adds them), DeepSpeed's
  ``engine.backward(loss)`` and Accelerate's ``accelerator.backward(loss)`` argument (the
  micro-batch's loss before they divide it by the accumulation steps: averaged). Lightning's
  strategy calls ``closure_loss.backward()`` with the loss already divided by
  ``accumulate_grad_batches``: the plain rule (sum of divided values) gives Lightning's
  training_step mean. Backward calls inside one of these wrappers are not counted again.
- ``probe_agent.log(loss=...)`` for a step overrides all of it (steps.py).
- A loss on the ``meta`` device is not counted: it is a shape-only pass (a FLOP count on a meta
  copy of the model, as litgpt's pretrain runs before its first step), with no value to read.

Cost
----
One Python wrapper call per ``backward()`` (a few µs), a ``detach()`` (no copy) and a tuple
append. Nothing is read from the device on the training thread here: the step's value is a
tensor until the writer thread (or a guard that asked for it) converts it.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
from typing import Any

from .. import patches
from . import Guard
from .torch_import import imported

#: Kinds of one recorded value: a share of the step (summed) or a whole micro-batch (averaged).
PART, WHOLE = "part", "whole"


class LossMeter:
    """Records the loss of each step (see the module docstring). ``take()`` on the training
    thread at each step boundary returns it."""

    def __init__(self) -> None:
        self.guard = Guard("loss meter")
        #: (tensor or float, kind, divisor) of the backward calls since the last step
        self.values: list[tuple[Any, str, float | None]] = []
        self.source: str | None = None  # who reported the last value
        self._depth = 0  # inside a framework's own backward / training_step
        self._thread: int | None = None
        self._scaled: tuple[Any, Any] | None = None  # (scaler.scale() output, its input)
        self._wrapped: list[patches.Patch] = []  # in the patch ledger (patches.py)
        self._lock = threading.Lock()
        #: the agent's own re-runs (nan_hunt.py) set this: their backward is not the job's
        self.paused = False

    # -- installing --------------------------------------------------------------------------
    def install(self) -> None:
        """Wrap what the program has imported so far (writer tick and first step); cheap once
        everything is wrapped."""
        with self._lock:
            if (ag := imported("torch.autograd")) is not None:
                self._wrap(ag, "backward", self._plain_backward, "torch")
            if (tr := imported("transformers.trainer")) is not None:
                cls = getattr(tr, "Trainer", None)
                if cls is not None:
                    self._wrap(cls, "training_step", self._framework_value(
                        "hf_trainer", PART, from_result=True), "hf_trainer")
            if (ds := imported("deepspeed.runtime.engine")) is not None:
                cls = getattr(ds, "DeepSpeedEngine", None)
                if cls is not None:
                    self._wrap(cls, "backward", self._framework_value("deepspeed", WHOLE),
                               "deepspeed")
            if (acc := imported("accelerate.accelerator")) is not None:
                cls = getattr(acc, "Accelerator", None)
                if cls is not None:
                    self._wrap(cls, "backward", self._framework_value("accelerate", WHOLE),
                               "accelerate")

    def _wrap(self, owner: Any, name: str, make: Any, source: str) -> None:
        original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(
            owner, name, None)
        if original is None or patches.ours(original) is not None:
            return
        wrapper = make(original)
        wrapper.__wrapped__ = original
        self._wrapped.append(patches.replace(
            owner, name, wrapper, by="numerics (loss)",
            why=f"reads the loss of each step ({source}): python.steps.loss"))

    def uninstall(self) -> None:
        with self._lock:
            wrapped, self._wrapped = self._wrapped, []
            for patch in reversed(wrapped):
                patches.restore(patch)

    def installed(self) -> list[str]:
        return [f"{getattr(p.owner, '__name__', p.owner)}.{p.attribute}" for p in self._wrapped]

    # -- the wrappers (training thread) --------------------------------------------------------
    def _plain_backward(self, original: Any) -> Any:
        meter = self

        @functools.wraps(original)
        def backward(tensors: Any, grad_tensors: Any = None, *args: Any, **kwargs: Any) -> Any:
            if not meter._depth and not meter.paused and grad_tensors is None and \
                    kwargs.get("grad_tensors") is None:
                meter._seen(tensors)
            return original(tensors, grad_tensors, *args, **kwargs)

        return backward

    def _framework_value(self, source: str, kind: str, from_result: bool = False) -> Any:
        meter = self

        def make(original: Any) -> Any:
            @functools.wraps(original)
            def wrapped(obj: Any, *args: Any, **kwargs: Any) -> Any:
                if meter._depth or meter.paused:
                    return original(obj, *args, **kwargs)
                loss = None if from_result else (args[0] if args else kwargs.get("loss"))
                meter._depth += 1
                try:
                    result = original(obj, *args, **kwargs)
                finally:
                    meter._depth -= 1
                meter._add(result if from_result else loss, source, kind)
                return result

            return wrapped

        return make

    def scaled(self, output: Any, given: Any) -> None:
        """The loop monitor's GradScaler.scale wrapper: ``output`` is ``given x scale``."""
        self._scaled = (output, given)

    def _seen(self, tensors: Any) -> None:
        try:
            t = tensors
            if isinstance(t, (list, tuple)):
                if len(t) != 1:
                    return
                t = t[0]
            if not hasattr(t, "grad_fn") or t.numel() != 1:
                return
            pair = self._scaled
            if pair is not None and pair[0] is t:
                t = pair[1]  # the unscaled loss the scaler was given
                self._scaled = None
            self._add(t, "backward", None)
        except Exception as e:  # noqa: BLE001 - inside the job's backward(): counted
            self.guard.failed(e)

    def _add(self, value: Any, source: str, kind: str | None) -> None:
        """One value for the step in progress; ``kind`` None: read off its grad_fn."""
        if not self.guard.enabled or value is None:
            return
        try:
            divisor = None
            if getattr(getattr(value, "device", None), "type", None) == "meta":
                # a shape-only pass (litgpt's measure_flops runs forward and backward on a meta
                # copy of the model before its first step): no value, not the step's loss. It
                # was averaged into step 1's, which then read NaN ("NaN/Inf: first at step 1")
                return
            if hasattr(value, "detach"):
                if value.numel() != 1:
                    value = value.detach().float().mean()
                if kind != PART:
                    divisor = _divisor(value)
                value = value.detach()
            if len(self.values) < 10_000:
                self.values.append((value, kind or WHOLE, divisor))
            self.source = source
            self._thread = threading.get_ident()
        except Exception as e:  # noqa: BLE001 - inside the job's backward(): counted
            self.guard.failed(e)

    # -- the step boundary (training thread) ---------------------------------------------------
    def take(self) -> tuple[Any, str | None, int]:
        """(the step's loss, its source, micro-batches seen) and start the next step.

        The loss is a 0-dim tensor (or a float, or None): converted later, off this thread."""
        values, self.values = self.values, []
        source = self.source
        if not values:
            return None, None, 0
        try:
            return combine(values), source, len(values)
        except Exception as e:  # noqa: BLE001 - training thread: counted
            self.guard.failed(e)
            return None, source, len(values)


def combine(values: list[tuple[Any, str, float | None]]) -> Any:
    """The step's loss from its micro-batches' values (see the module docstring)."""
    n = len(values)
    if n == 1:
        return values[0][0]
    parts = all(kind == PART or (d is not None and abs(d - n) < 0.5) for _, kind, d in values)
    total: Any = values[0][0]
    for v, _, _ in values[1:]:
        total = total + v
    return total if parts else total / n


def _divisor(t: Any) -> float | None:
    """The constant the loss was divided by at its last op (``loss / 4`` -> 4, ``loss * 0.25``
    -> 4), else None. The saved constant is a CPU scalar: reading it costs no device sync."""
    gf = getattr(t, "grad_fn", None)
    if gf is None:
        return None
    name = gf.name()
    if name not in ("DivBackward0", "MulBackward0"):
        return None
    other = getattr(gf, "_saved_other", None)
    if other is None or not hasattr(other, "numel") or other.numel() != 1 or \
            other.device.type != "cpu":
        return None
    c = other.tolist()  # float() fails under a dispatch mode (the FLOP meter's); tolist not
    if not isinstance(c, (int, float)) or not math.isfinite(c) or c == 0:
        return None
    return float(c) if name == "DivBackward0" else 1.0 / c


def to_float(value: Any) -> float | None:
    """A recorded loss as a float (writer thread): NaN stays NaN; unknown is None."""
    if value is None:
        return None
    try:
        if hasattr(value, "item"):
            value = value.float().item() if hasattr(value, "float") else value.item()
        return float(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return math.nan


def torch_loaded() -> bool:
    return "torch" in sys.modules
