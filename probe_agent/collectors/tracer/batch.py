"""What one optimizer step fed the root model: samples, tokens, micro-batches, context length and
the dtype its matmuls ran in, gathered from the root calls of traced steps.

Tokens are B x T of the root call's integer input: the first integer tensor of two or more
dimensions among the positional arguments, else ``input_ids`` (the HF convention: the Trainer
and most Lightning modules call ``model(**batch)``), else the first such keyword argument.
Only root calls made with grad enabled count (the tracer checks): a validation pass under
``no_grad`` inside a step feeds no training tokens. Padding counts as tokens (what the model
computes on, which is what FLOPs and MFU need). A 1-D integer input (class labels) has no tokens.

The compute dtype is read inside the root call, where the job's autocast is active: the
autocast dtype when autocast is on for the input's device, else the dtype of the root's first
parameter; float32 on CUDA with TF32 matmuls allowed is ``tf32`` (that picks the peak).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepBatch:
    """The root calls of one traced step, summed (samples, tokens) or kept (the rest)."""

    samples: int | None = None
    tokens: int | None = None
    micro_batches: int = 0  # calls of the step's first root (gradient accumulation)
    context: int | None = None  # T of the token input (the largest seen in the step)
    dtype: str | None = None
    device: str | None = None
    shapes: list[tuple[int, ...]] = field(default_factory=list)  # token input shapes, in order
    root: int = 0  # id() of the step's first root: a loss module called at top level is not it

    def add(self, torch: Any, module: Any, args: tuple[Any, ...], kwargs: Any) -> None:
        """One root call (training thread, inside the call: autocast as the job set it)."""
        if not self.root:
            self.root = id(module)
        elif id(module) != self.root:
            return
        self.micro_batches += 1
        first = args[0] if args else None
        tok = _token_input(torch, args, kwargs)
        if isinstance(first, torch.Tensor) and first.dim() > 0:
            self.samples = (self.samples or 0) + int(first.shape[0])
        elif tok is not None:
            self.samples = (self.samples or 0) + int(tok.shape[0])
        if tok is not None:
            b, t = int(tok.shape[0]), int(tok.shape[1])
            self.tokens = (self.tokens or 0) + b * t
            self.context = max(self.context or 0, t)
            self.shapes.append(tuple(tok.shape))
        if self.dtype is None:
            ref = tok if tok is not None else first
            dev = ref.device.type if isinstance(ref, torch.Tensor) else "cpu"
            self.device = dev
            self.dtype = compute_dtype(torch, module, dev)


def _token_input(torch: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    for a in args:
        if _is_tokens(torch, a):
            return a
    if isinstance(kwargs, dict) and kwargs:
        ids = kwargs.get("input_ids")
        if _is_tokens(torch, ids):
            return ids
        for v in kwargs.values():
            if _is_tokens(torch, v):
                return v
    return None


def _is_tokens(torch: Any, a: Any) -> bool:
    return (isinstance(a, torch.Tensor) and a.dim() >= 2 and not a.is_floating_point()
            and not a.is_complex() and a.dtype is not torch.bool)


def compute_dtype(torch: Any, module: Any, device: str) -> str | None:
    """The dtype the matmuls of this call run in (see the module docstring)."""
    try:
        if torch.is_autocast_enabled(device):
            return _name(torch.get_autocast_dtype(device))
    except (RuntimeError, TypeError):  # a device type autocast does not know
        pass
    p = next(iter(module.parameters()), None) if hasattr(module, "parameters") else None
    if p is None:
        return None
    name = _name(p.dtype)
    if name == "float32" and device == "cuda" and (
            torch.backends.cuda.matmul.allow_tf32
            or torch.get_float32_matmul_precision() != "highest"):
        return "tf32"
    return name


def _name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")
