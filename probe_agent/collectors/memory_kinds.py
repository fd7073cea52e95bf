"""Bytes of parameters, gradients and optimizer state: the tensors training keeps between steps.

Counted on traced steps right after ``optimizer.step()`` (steps.py), on the training thread:
gradients are still there then (``zero_grad`` comes later in the loop). Under FSDP2 a parameter,
its gradient and its optimizer state are DTensors: what this rank holds is the local shard
(``_local_tensor``), and that is what is counted; under ZeRO-style sharded optimizers the state
dict only holds this rank's share, so counting it gives the local share too. Each tensor counts
once (by its address and size: tied weights, a state tensor shared by two groups). A master
copy the optimizer steps instead of the model's parameters (DeepSpeed ZeRO's flat fp32
partition) is optimizer state: ZeRO-1/2 shard that, not the parameters.
Cost: one pass over the parameters and the optimizers' state, ~1 us a tensor.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any


def local_bytes(t: Any) -> tuple[int, int]:
    """``(address, bytes)`` of what this rank holds of ``t`` (a DTensor's local shard, a
    ZeRO-3 parameter's partition: its ``ds_tensor``, while the parameter itself is empty)."""
    local = getattr(t, "_local_tensor", None)
    if local is None and getattr(t, "ds_tensor", None) is not None and t.numel() == 0:
        local = t.ds_tensor
    if local is not None:
        t = local
    try:
        ptr = t.data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        ptr = id(t)
    return ptr, t.numel() * t.element_size()


def _sum(tensors: Iterable[Any], seen: set[tuple[int, int]], plain: tuple[type, ...]) -> int:
    total = 0
    for t in tensors:
        if type(t) in plain:  # no shard to look for: two C calls (this runs per tensor)
            try:
                key = (t.data_ptr(), t.nbytes)
            except (RuntimeError, NotImplementedError, TypeError):
                key = local_bytes(t)
            if not key[1]:  # empty: a ZeRO-3 parameter between gathers holds its partition
                key = local_bytes(t)
        else:
            key = local_bytes(t)
        if key not in seen:
            seen.add(key)
            total += key[1]
    return total


def trained_params(root: Any, optimizers: Iterable[Any]) -> list[Any]:
    """The parameters of ``root`` (a module, or None) and of the optimizers' param groups,
    each once (frozen ones count too: they take memory). With a root that has parameters, an
    optimizer's plain tensor (not an ``nn.Parameter``) is a master copy, not a parameter:
    DeepSpeed ZeRO's flat fp32 partition (stage 1/2: ``single_partition_of_fp32_groups``,
    stage 3: ``fp32_partitioned_groups_flat``) beside the model's own parameters; count_kinds
    counts it with the optimizer's state."""
    seen: dict[int, Any] = {}
    if root is not None and hasattr(root, "parameters"):
        for p in root.parameters():
            seen[id(p)] = p
    torch = sys.modules.get("torch")
    plain = torch.Tensor if torch is not None and seen else None
    for opt in optimizers:
        for group in getattr(opt, "param_groups", ()) or ():
            for p in group.get("params", ()):
                if type(p) is not plain:
                    seen[id(p)] = p
    return list(seen.values())


def count_kinds(torch: Any, params: list[Any],
                optimizers: Iterable[Any]) -> tuple[int, int, int, int, bool]:
    """``(parameter, gradient, optimizer-state, fp32-parameter bytes, sharded)`` of this rank;
    ``sharded``: some parameter is a DTensor (FSDP2: optimizer state is sharded already)."""
    seen: set[tuple[int, int]] = set()
    tensor = torch.Tensor
    plain = (tensor, torch.nn.Parameter)
    p_bytes = _sum(params, seen, plain)
    fp32 = torch.float32
    p32 = sum(local_bytes(p)[1] for p in params if p.dtype == fp32)
    sharded = any(type(p) not in plain and getattr(p, "_local_tensor", None) is not None
                  for p in params)
    g_bytes = _sum((p.grad for p in params if isinstance(p.grad, tensor)), seen, plain)
    o_bytes = 0
    done: set[int] = set()
    for opt in optimizers:
        if opt is None or id(opt) in done:
            continue
        done.add(id(opt))
        state = getattr(opt, "state", None) or {}
        o_bytes += _sum((v for s in state.values() if isinstance(s, dict)
                         for v in s.values() if isinstance(v, tensor)), seen, plain)
        # master copies trained_params left out (seen holds every parameter counted above)
        o_bytes += _sum((p for group in getattr(opt, "param_groups", ()) or ()
                         for p in group.get("params", ()) if isinstance(p, tensor)), seen, plain)
    return p_bytes, g_bytes, o_bytes, p32, sharded


def grad_bytes(torch: Any, params: list[Any]) -> int:
    """The gradient bytes of ``params`` (as count_kinds counts them, apart: gradients are new
    tensors every step, while parameters and optimizer state stay)."""
    tensor = torch.Tensor
    return _sum((p.grad for p in params if isinstance(p.grad, tensor)), set(),
                (tensor, torch.nn.Parameter))
