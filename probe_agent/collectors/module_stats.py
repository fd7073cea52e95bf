"""Per-module numbers of one step: gradient norm, weight norm, update/weight ratio and the
largest absolute activation, for ``python.numerics`` (numerics.py decides when).

- **Names** come from the model's ``named_modules()`` (the root the tracer saw, unwrapped from
  DDP/compile/DeepSpeed; wrapper components dropped), so they match ``python.torch_trace``.
  A parameter belongs to the module that holds it directly (``recurse=False``).
- **Gradient and weight norms**: one ``torch._foreach_norm`` over every parameter, grouped by
  module afterwards (sqrt of the sum of squares). Kept as one stacked tensor: the writer thread
  reads it, the training thread never waits for the device.
- **Update/weight ratio** of the step: the parameters are copied right before the optimizer
  step (only when they fit under ``SNAPSHOT_MAX_BYTES``) and ``||w_after - w_before|| /
  ||w_before||`` is taken right after it. Healthy training sits around 1e-3 per step (Karpathy's
  rule of thumb); 1e-1 and up is an LR far too high, 1e-6 and below one far too low.
- **Largest absolute activation**: a global forward hook, installed for traced steps only,
  takes ``amax(|output|)`` of each module call (NaN/Inf propagate through amax, so a non-finite
  output shows as a non-finite maximum).
"""

from __future__ import annotations

import math
from typing import Any

#: Parameters are copied for the update ratio only up to this size (a traced step holds one
#: more copy of the weights for the length of optimizer.step()).
SNAPSHOT_MAX_BYTES = 1 << 30
_WRAPPERS = ("_orig_mod", "module")
_INNER = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")


def unwrap(root: Any) -> Any:
    """The user's model under DDP, torch.compile and DeepSpeed's engine."""
    seen = 0
    while seen < 4 and type(root).__name__ in (
            "DistributedDataParallel", "DataParallel", "OptimizedModule", "DeepSpeedEngine",
            "PipelineEngine"):
        root = getattr(root, "module", None) or getattr(root, "_orig_mod", None) or root
        seen += 1
    return root


def clean(name: str) -> str:
    return ".".join(p for p in name.split(".") if p not in _INNER)


class ModuleMap:
    """The model's module and parameter names, built once per model."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.modules: dict[int, str] = {}
        self.groups: list[tuple[str, list[Any]]] = []
        for name, m in model.named_modules():
            name = clean(name)
            self.modules[id(m)] = name or type(model).__name__  # the root: by its class
            own = [p for p in m.parameters(recurse=False)]
            if own:
                self.groups.append((name or type(model).__name__, own))
        self.params = [p for _, ps in self.groups for p in ps]
        self.sizes = [len(ps) for _, ps in self.groups]


def local(t: Any) -> Any:
    """A DTensor's local shard (FSDP2): norms stay on this rank, no collective."""
    return t.to_local() if hasattr(t, "to_local") else t


def grad_norms(torch: Any, params: list[Any]) -> Any:
    """Per-parameter gradient norms as one float tensor (0 for parameters without one)."""
    grads = [local(p.grad) for p in params if p.grad is not None]
    if not grads:
        return None
    norms = [n.float() for n in torch._foreach_norm(grads)]
    if len(grads) == len(params):
        return torch.stack(norms)
    it = iter(norms)
    zero = torch.zeros((), device=norms[0].device)
    return torch.stack([next(it) if p.grad is not None else zero for p in params])


def module_grad_norms(torch: Any, mm: ModuleMap | None) -> list[tuple[str, float]]:
    """Each module's own gradient norm (its parameters', not its children's), read now."""
    if mm is None or not mm.params:
        return []
    with torch.no_grad():
        norms = grad_norms(torch, mm.params)
    if norms is None:
        return []
    vals, out, i = norms.tolist(), [], 0
    for (name, _), n in zip(mm.groups, mm.sizes):
        out.append((name, math.sqrt(sum(x * x for x in vals[i:i + n]))))
        i += n
    return out


def total_norm(torch: Any, optimizer: Any) -> Any:
    """The total gradient norm over the optimizer's parameters (a 0-dim tensor), or None."""
    grads = [local(p.grad) for g in getattr(optimizer, "param_groups", ()) for p in g["params"]
             if p.grad is not None]
    if not grads:
        return None
    norms = torch._foreach_norm(grads)
    if len({n.device for n in norms}) > 1:
        norms = [n.to(norms[0].device) for n in norms]
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))


class StepStats:
    """The per-module numbers of one traced step, filled on the training thread, read as rows
    on the writer thread."""

    def __init__(self, torch: Any, mm: ModuleMap) -> None:
        self.mm = mm
        params = mm.params
        with torch.no_grad():
            self.grads = grad_norms(torch, params)
            self.weights = torch.stack([n.float() for n in torch._foreach_norm(
                [local(p.detach()) for p in params])]) if params else None
            size = sum(p.numel() * p.element_size() for p in params)
            self.before = [local(p.detach()).clone() for p in params] \
                if 0 < size <= SNAPSHOT_MAX_BYTES else None
        self.updates: Any = None
        self.acts: dict[str, list[Any]] = {}

    def after_step(self, torch: Any) -> None:
        before, self.before = self.before, None
        if before is None:
            return
        with torch.no_grad():
            now = [local(p.detach()) for p in self.mm.params]
            diff = torch._foreach_sub(now, before)
            self.updates = torch.stack([n.float() for n in torch._foreach_norm(diff)])

    def rows(self) -> list[tuple[str, float | None, float | None, float | None, float | None]]:
        """(module, grad norm, weight norm, update ratio, max |activation|) per module
        (writer thread: reads the device)."""
        g = self.grads.tolist() if self.grads is not None else None
        w = self.weights.tolist() if self.weights is not None else None
        u = self.updates.tolist() if self.updates is not None else None
        out = []
        i = 0
        for (name, _), n in zip(self.mm.groups, self.mm.sizes):
            gn = _l2(g[i:i + n]) if g is not None else None
            wn = _l2(w[i:i + n]) if w is not None else None
            un = _l2(u[i:i + n]) if u is not None else None
            ratio = un / wn if un is not None and wn else None
            out.append((name, gn, wn, ratio, _amax(self.acts.pop(name, None))))
            i += n
        for name, vals in self.acts.items():  # modules without parameters of their own
            out.append((name, None, None, None, _amax(vals)))
        return out


def _l2(xs: list[float]) -> float:
    return math.sqrt(sum(x * x for x in xs))


def _amax(vals: list[Any] | None) -> float | None:
    if not vals:
        return None
    out = None
    for v in vals:
        x = float(v)
        if not math.isfinite(x):
            return x
        out = x if out is None else max(out, x)
    return out


class ActivationHook:
    """A global forward hook that keeps ``amax(|output|)`` of each named module call."""

    def __init__(self, torch: Any, failed: Any) -> None:
        self.torch = torch
        self.failed = failed  # the recorder's Guard: a hook error never reaches forward()
        self.handle: Any = None
        self.names: dict[int, str] = {}
        self.into: dict[str, list[Any]] | None = None
        self.root: Any = None  # the model: its logits' last dimension is the classes
        #: classes the model's output scores (logits' last dimension), once a call showed it
        self.classes: int | None = None

    def on(self, names: dict[int, str], into: dict[str, list[Any]]) -> None:
        self.names, self.into = names, into
        if self.handle is None:
            from torch.nn.modules import module as module_mod

            self.handle = module_mod.register_module_forward_hook(self._hook)

    def off(self) -> None:
        h, self.handle = self.handle, None
        self.into = None
        if h is not None:
            h.remove()

    def _hook(self, module: Any, args: Any, output: Any) -> None:
        try:
            self._keep(module, output)
        except Exception as e:  # noqa: BLE001 - inside the job's forward: counted
            self.failed(e)

    def _keep(self, module: Any, output: Any) -> None:
        if module is self.root and self.classes is None:
            logits = getattr(output, "logits", None)
            if logits is None:
                logits = output if isinstance(output, self.torch.Tensor) else None
            if isinstance(logits, self.torch.Tensor) and logits.dim() >= 2 and \
                    logits.is_floating_point() and logits.shape[-1] > 1:
                self.classes = int(logits.shape[-1])
        into = self.into
        if into is None:
            return
        name = self.names.get(id(module))
        if name is None:
            return
        t = output if isinstance(output, self.torch.Tensor) else (
            output[0] if isinstance(output, (tuple, list)) and output and
            isinstance(output[0], self.torch.Tensor) else None)
        if t is None or not t.is_floating_point() or t.numel() == 0:
            return
        with self.torch.no_grad():
            into.setdefault(name or type(module).__name__, []).append(
                t.detach().abs().amax().float())
