"""Where the first NaN/Inf came from: one re-run of the bad step's forward and backward.

Why a re-run, and why it costs nothing on healthy steps
-------------------------------------------------------
Checking every module's output on every step (forward hooks, ``detect_anomaly``) costs 2-3x a
step. Instead the numerics recorder checks two numbers per step, the loss and the total gradient
norm, right before ``optimizer.step()`` (numerics.py). On the first step where either is not
finite the optimizer has not run yet, so the weights are still the ones that made the NaN, and
the recorder kept references to what the root model was called with in this step (a forward
pre-hook on the root: one list append per micro-batch). This module then runs those calls again
on the unwrapped model (no DDP reducer, no collectives), once, with:

- forward pre/post hooks on every submodule: the module stack, and the first module whose
  output is non-finite, with the batch rows (samples) that hold the bad values;
- a ``TorchFunctionMode``: the first torch function (``torch.log``, ``Tensor.__truediv__``...)
  whose result is non-finite while its tensor arguments are finite, and the module it ran in:
  that module *produced* the value; a module whose inputs were already bad *received* it;
- when the whole forward is finite, a backward (``torch.autograd.grad`` over the parameters:
  nothing is accumulated into ``.grad`` and DDP's reducer hooks do not fire) under a
  ``TorchDispatchMode``: the first aten op whose result is non-finite from finite inputs, the
  autograd node running it (``SqrtBackward0``) and the module whose forward made that node.
  The backward starts from the model's own scalar loss when it returns one (HF models), else
  from the mean of its output (the script's loss function is not known to the agent; a NaN
  made by the loss function's own backward then shows as "outside the model").

The job's state is left as it was: the random number generators, the buffers (BatchNorm running
statistics), ``.grad`` and the autocast state; the loss meter is paused so the re-run's backward
is not recorded. Under DDP every rank sees the NaN in the same step (the gradient all-reduce
spreads it), re-runs its own batch, and only the rank the value came from finds it; the others
report that they received it.

Sharded parameters (FSDP2): the forward all-gathers each sharded module's weights, so the
re-run runs on every rank at once (``collective``: the ranks agreed that the step was
non-finite, sharded.py) and runs the same calls on each: every micro-batch's forward, to the
end, whatever one rank found (a rank stopping early would leave the others waiting in an
all-gather), under ``no_grad``, then every FSDP2 module is resharded. The backward is not
re-run there: FSDP2's gradients flow to weights gathered for the step only, not to the
parameters ``torch.autograd.grad`` could be asked about, so a NaN born in the backward is
reported as not found in the forward.
"""

from __future__ import annotations

import math
import time
from typing import Any

#: The longest text kept for an op or node name.
_NAME = 120
#: Samples named at most.
MAX_SAMPLES = 16


def hunt(torch: Any, model: Any, calls: list[tuple[Any, Any, Any]], sample_ids: list[Any],
         names: dict[int, str], collective: bool = False) -> dict[str, Any]:
    """Re-run ``calls`` (``(args, kwargs, autocast)`` of each root call of the bad step, the
    autocast ``(device type, dtype)`` it ran under or None) on ``model``; ``collective``: every
    rank does the same at once (sharded parameters, see the module docstring).

    Returns a dict: ``stage`` ('weights' | 'input' | 'forward' | 'backward' | 'none'), ``role``
    ('produced' | 'received' | None), ``module``, ``op``, ``micro_batch``, ``samples`` (batch
    rows, as DataLoader indices when ``sample_ids`` has them), ``note``."""
    if collective:
        return _hunt_sharded(torch, model, calls, sample_ids, names)
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return {"stage": "unchecked", "note": "parameters are DTensors (FSDP2) and the ranks "
                "did not agree on a re-run (agreeing needs an agent on every rank, each announced "
                "in the job's store): the rank's own loss and gradients are reported"}
    weights = _bad_weights(torch, model, names)
    if weights is not None:
        return weights
    saved = _save(torch, model)
    try:
        for i, (args, kwargs, amp) in enumerate(calls):
            found = _forward(torch, model, args, kwargs or {}, names, amp)
            if found.get("stage") != "none":
                return _with_samples(found, i, sample_ids)
            out = found.pop("output", None)
            back = _backward(torch, model, out, names)
            if back.get("stage") != "none":
                return _with_samples(back, i, sample_ids)
        return {"stage": "none", "note": f"the re-run of this rank's {len(calls)} micro-batch"
                f"{'es' if len(calls) != 1 else ''} stayed finite: the NaN/Inf was not made "
                "here (received in a collective, or made by the loss function's backward)"}
    finally:
        _restore(torch, model, saved)


def _hunt_sharded(torch: Any, model: Any, calls: list[tuple[Any, Any, Any]],
                  sample_ids: list[Any], names: dict[int, str]) -> dict[str, Any]:
    from .sharded import reshard

    saved = _save(torch, model)
    first: dict[str, Any] | None = None
    try:
        with torch.no_grad():
            for i, (args, kwargs, amp) in enumerate(calls):
                found = _forward(torch, model, args, kwargs or {}, names, amp, to_end=True)
                if first is None and found.get("stage") != "none":
                    first = _with_samples(found, i, sample_ids)
    finally:
        try:
            reshard(model)
        finally:
            _restore(torch, model, saved)
    if first is not None:
        return first
    return {"stage": "none", "note": f"the forward re-run of this rank's {len(calls)} micro-"
            f"batch{'es' if len(calls) != 1 else ''} stayed finite (FSDP2: the backward is not "
            "re-run): received from another rank, or made in the backward"}


def _bad_weights(torch: Any, model: Any, names: dict[int, str]) -> dict[str, Any] | None:
    """The first parameter that already holds NaN/Inf before the step's forward, or None.

    Such a step's forward makes NaN from a finite batch in the module that holds it, and the
    re-run used to say "produced in the forward of module 'wte' by an op" with "clamp its
    input, add an epsilon" as the next step: wrong, the weights were bad before the step
    began (an optimizer update that made NaN from finite gradients, a loaded checkpoint, code
    that wrote them). Read on the first non-finite step only: one isfinite per parameter."""
    for mod in model.modules():
        for pname, p in mod.named_parameters(recurse=False):
            t = p.detach()
            if not _bad(torch, t):
                continue
            bad = ~torch.isfinite(t)
            rows = ([int(i) for i in bad.reshape(t.shape[0], -1).any(1).nonzero().flatten()
                     [:MAX_SAMPLES].tolist()] if t.dim() else [])
            module = names.get(id(mod), type(mod).__name__)
            return {"stage": "weights", "role": "received", "module": module, "op": None,
                    "param": pname, "param_rows": rows, "bad_values": int(bad.sum()),
                    "values": t.numel(),
                    "note": f"parameter {pname!r} of module {module!r} held NaN/Inf before the "
                            f"step's forward ({int(bad.sum())} of {t.numel()} values; rows "
                            f"{rows})"}
    return None


def _save(torch: Any, model: Any) -> dict[str, Any]:
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return {
        "rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if cuda else None,
        "buffers": [(b, b.detach().clone()) for b in model.buffers()],
        "grads": [(p, p.grad) for p in model.parameters()],
        "grad_enabled": torch.is_grad_enabled(),
    }


def _restore(torch: Any, model: Any, saved: dict[str, Any]) -> None:
    torch.set_rng_state(saved["rng"])
    if saved["cuda_rng"] is not None:
        torch.cuda.set_rng_state_all(saved["cuda_rng"])
    with torch.no_grad():
        for b, copy in saved["buffers"]:
            b.copy_(copy)
    for p, g in saved["grads"]:
        p.grad = g
    torch.set_grad_enabled(saved["grad_enabled"])


def _bad(torch: Any, x: Any) -> bool:
    return isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()) and \
        x.numel() > 0 and not bool(torch.isfinite(x).all())


def _tensors(torch: Any, obj: Any, depth: int = 0) -> list[Any]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 3:
        return []
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(torch, o, depth + 1)]
    if hasattr(obj, "to_tuple"):  # an HF ModelOutput
        return _tensors(torch, obj.to_tuple(), depth + 1)
    return []


def _rows(torch: Any, x: Any, batch: int | None) -> list[int]:
    """The first-dimension rows of ``x`` that hold a non-finite value, when that dimension is
    the batch's."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or (batch is not None and
                                                           x.shape[0] != batch):
        return []
    bad = (~torch.isfinite(x.detach())).reshape(x.shape[0], -1).any(1)
    return [int(i) for i in bad.nonzero().flatten()[:MAX_SAMPLES].tolist()]


def _forward(torch: Any, model: Any, args: Any, kwargs: Any, names: dict[int, str],
             amp: Any = None, to_end: bool = False) -> Any:
    """One root call under the hooks and the function mode; ``to_end``: run the forward even
    when the input is already bad (every rank must run the same collectives)."""
    from torch.overrides import TorchFunctionMode

    stack: list[str] = []
    found: dict[str, Any] = {}
    inputs = _tensors(torch, (args, kwargs))
    batch = next((int(t.shape[0]) for t in inputs if t.dim() > 0), None)
    if any(_bad(torch, t) for t in inputs) and not to_end:
        bad = next(t for t in inputs if _bad(torch, t))
        return {"stage": "input", "role": "received", "module": names.get(id(model), ""),
                "op": None, "rows": _rows(torch, bad, batch),
                "note": "the batch the model was given already holds NaN/Inf"}
    node_module: dict[int, tuple[Any, str]] = {}

    class FirstBad(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, a: Any = (), kw: Any = None) -> Any:
            out = func(*a, **(kw or {}))
            try:
                where = stack[-1] if stack else names.get(id(model), "")
                for t in _tensors(torch, out):
                    gf = getattr(t, "grad_fn", None)
                    if gf is not None and id(gf) not in node_module:
                        node_module[id(gf)] = (gf, where)
                ins = _tensors(torch, (a, kw))
                # a factory (torch.empty, a collective's output buffer) holds garbage: only a
                # function of finite tensors that returns a non-finite one made the value
                if "op" not in found and ins and not _factory(func) and \
                        any(_bad(torch, t) for t in _tensors(torch, out)) and \
                        not any(_bad(torch, t) for t in ins):
                    t = next(t for t in _tensors(torch, out) if _bad(torch, t))
                    found.update(op=_op_name(func), module=where, rows=_rows(torch, t, batch))
            except Exception:  # noqa: BLE001 - a check must not change the re-run's result
                pass
            return out

    def pre(m: Any, _a: Any) -> None:
        stack.append(names.get(id(m), type(m).__name__))

    def post(m: Any, a: Any, out: Any) -> None:
        name = stack.pop() if stack else names.get(id(m), "")
        if "first_module" in found:
            return
        bad = next((t for t in _tensors(torch, out) if _bad(torch, t)), None)
        if bad is not None:
            received = any(_bad(torch, t) for t in _tensors(torch, a))
            found.update(first_module=name, first_received=received,
                         first_rows=_rows(torch, bad, batch))

    if any(_bad(torch, t) for t in inputs):  # to_end: the input was already bad
        bad = next(t for t in inputs if _bad(torch, t))
        model(*args, **kwargs)
        return {"stage": "input", "role": "received", "module": names.get(id(model), ""),
                "op": None, "rows": _rows(torch, bad, batch),
                "note": "the batch the model was given already holds NaN/Inf"}
    handles = []
    for m in model.modules():
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    try:
        with (_null() if to_end else torch.enable_grad()), FirstBad(), (
                torch.autocast(amp[0], dtype=amp[1]) if amp else _null()):
            out = model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    if "op" in found or "first_module" in found:
        module = found.get("module", found.get("first_module"))
        return {"stage": "forward", "role": "produced", "module": module, "op": found.get("op"),
                "rows": found.get("rows", found.get("first_rows", [])),
                "note": f"first non-finite output: module {found.get('first_module')!r}"}
    return {"stage": "none", "output": (out, node_module)}


def _backward(torch: Any, model: Any, out: Any, names: dict[int, str]) -> dict[str, Any]:
    from torch.utils._python_dispatch import TorchDispatchMode

    if out is None:
        return {"stage": "none"}
    result, node_module = out
    target = _scalar_loss(torch, result)
    if target is None:
        ts = [t for t in _tensors(torch, result) if t.requires_grad and t.is_floating_point()]
        if not ts:
            return {"stage": "none"}
        target = ts[0].float().mean()
    params = [p for p in model.parameters() if p.requires_grad]
    found: dict[str, Any] = {}

    class FirstBad(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), kw: Any = None) -> Any:
            out = func(*a, **(kw or {}))
            if "op" not in found:
                try:
                    outs = _tensors(torch, out)
                    if any(_bad(torch, t) for t in outs) and \
                            not any(_bad(torch, t) for t in _tensors(torch, (a, kw))):
                        node = torch._C._current_autograd_node()
                        entry = node_module.get(id(node)) if node is not None else None
                        found.update(op=str(func)[:_NAME],
                                     node=node.name() if node is not None else None,
                                     module=entry[1] if entry else None)
                except Exception:  # noqa: BLE001 - a check must not change the re-run
                    pass
            return out

    with FirstBad():
        grads = torch.autograd.grad(target, params, allow_unused=True)
    by_param = {id(p): g for p, g in zip(params, grads)}
    bad_modules = []
    for name, m in model.named_modules():
        own = [by_param.get(id(p)) for p in m.parameters(recurse=False)]
        if any(g is not None and _bad(torch, g) for g in own):
            bad_modules.append(name)
    if "op" not in found and not bad_modules:
        return {"stage": "none"}
    module = found.get("module") or (bad_modules[-1] if bad_modules else None)
    op = found.get("node") or found.get("op")
    if found.get("node") and found.get("op"):
        op = f"{found['node']} ({found['op']})"
    return {"stage": "backward", "role": "produced", "module": module, "op": op, "rows": [],
            "note": f"{len(bad_modules)} modules got non-finite gradients"
                    + (f", the first in forward order {bad_modules[0]!r}" if bad_modules else "")}


def _factory(func: Any) -> bool:
    name = getattr(func, "__name__", "") or ""
    return "empty" in name


def _null() -> Any:
    import contextlib

    return contextlib.nullcontext()


def _scalar_loss(torch: Any, result: Any) -> Any:
    loss = result.get("loss") if isinstance(result, dict) else getattr(result, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad:
        return loss
    if isinstance(result, torch.Tensor) and result.numel() == 1 and result.requires_grad:
        return result
    return None


def _op_name(func: Any) -> str:
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or str(func)
    mod = getattr(func, "__module__", "") or ""
    if mod.startswith("torch") and "." not in name and not mod.endswith("_tensor"):
        name = f"{mod}.{name}"
    elif "." not in name:
        name = f"Tensor.{name}" if mod.endswith("_tensor") or not mod else name
    return name[:_NAME]


def _with_samples(found: dict[str, Any], call: int, sample_ids: list[Any]) -> dict[str, Any]:
    rows = found.pop("rows", []) or []
    ids = sample_ids[call] if call < len(sample_ids) else None
    if isinstance(ids, (list, tuple)) and rows and all(r < len(ids) for r in rows):
        samples = [ids[r] for r in rows]
        found["samples_are"] = "dataloader indices"
    else:
        samples = rows
        found["samples_are"] = "rows of the batch"
    found["samples"] = samples
    found["micro_batch"] = call
    return found


def origin(torch: Any, mm: Any, calls: list[tuple[Any, Any, Any]], sample_ids: list[Any],
           loss: float | None, norm: float | None, rerun: bool,
           collective: bool) -> dict[str, Any]:
    """The first non-finite step's record (``first_nonfinite`` in /v1/numerics): its loss and
    norm and what the re-run of ``calls`` on ``mm`` (a module_stats.ModuleMap, or None while
    no root model is known) found, or why there was none (``rerun`` False: not every rank of a
    collective re-run could). Never raises: a failed re-run is said in the note."""
    info: dict[str, Any] = {"loss": loss, "grad_norm": norm,
                            "loss_finite": loss is not None and math.isfinite(loss)}
    t0 = time.perf_counter()
    if mm is None:
        # "unchecked": no re-run happened (the CLI must not say it stayed finite)
        found: dict[str, Any] = {"stage": "unchecked", "note": "no root model seen yet (the "
                                 "tracer names it at the first step it wraps)"}
    elif not calls:
        found = {"stage": "unchecked", "note": "the step's model inputs were not kept"}
    elif not rerun:
        found = {"stage": "unchecked", "note": "FSDP2: not every rank had the step's inputs "
                 "and model at hand, and a re-run must run on all of them at once"}
    else:
        try:
            found = hunt(torch, mm.model, calls, sample_ids, mm.modules, collective=collective)
        except Exception as e:  # noqa: BLE001 - the re-run failed: say so, go on
            found = {"stage": "unchecked", "note": f"re-run failed: {type(e).__name__}: {e}"}
    info.update(found)
    if mm is not None and found.get("module"):
        info["module_class"] = module_class(mm.model, mm.modules, found["module"])
    info["rerun_ms"] = (time.perf_counter() - t0) * 1e3
    return info


def module_class(model: Any, names: dict[int, str], name: str) -> str | None:
    """The class of the module called ``name`` (``names``: id -> name)."""
    ids = {m_id for m_id, n in names.items() if n == name}
    return next((type(m).__name__ for m in model.modules() if id(m) in ids), None)


def origin_note(info: dict[str, Any]) -> str:
    """The ``origin`` row's note: the step's numbers and what the re-run found."""
    bits = [f"loss {info.get('loss')}", f"grad norm {info.get('grad_norm')}"]
    if info.get("samples_are"):
        bits.append(f"samples are {info['samples_are']}")
    if info.get("micro_batch") is not None:
        bits.append(f"micro-batch {info['micro_batch']}")
    if info.get("note"):
        bits.append(str(info["note"]))
    bits.append(f"re-run {info.get('rerun_ms', 0):.0f} ms")
    return "; ".join(bits)
