"""Which rank holds each expert of an MoE layer (expert parallelism), read from the model and its
process groups as the job's own EP code laid them out -> ``python.moe_load.owner``.

With expert parallelism each rank keeps only its share of a layer's experts, and every rank's
router sends tokens to all of them through an all-to-all: the rank that holds the busiest expert
computes the most and its peers wait for it in the all-to-all. Naming that rank needs the
layout, which real EP code keeps in one of two ways (both read, no code change):

- **Sharded expert weights** (torchtitan's ``ExpertParallel``, and ``distribute_tensor`` code
  written like it): the experts' stacked weights are DTensors sharded on dim 0 (the expert
  dimension) over a device-mesh dimension: rank ``i`` of that mesh dimension holds experts
  ``[i * E/n, (i+1) * E/n)``.
- **An expert-parallel process group on the block** (DeepSpeed-MoE's ``MOELayer.ep_group`` with
  ``num_local_experts``, megablocks' ``args.expert_parallel_group``, plain code with an
  ``ep_group``): the block's experts are the local ones, and the group's rank ``i`` holds
  experts ``[i * local, (i+1) * local)`` (each rank the same count, contiguous, as DeepSpeed's
  ``Experts`` and megablocks lay them out).

Ranks are global ranks (``get_process_group_ranks``). None when the experts are all local (no
EP): every rank computes every expert, and the finding then says nothing about ranks. Read once
per router scan (model_scan.py: the first sampled step, steps 10 and 100), never per step.
"""

from __future__ import annotations

from typing import Any

#: Attributes that hold an expert-parallel process group (the block's, its experts', or an
#: ``args``/``config`` object's on either).
GROUP_NAMES = ("ep_group", "expert_group", "expert_parallel_group", "ep_pg", "moe_group",
               "ep_process_group")
#: Attributes that say how many experts the layer has in all (a router's output size).
GLOBAL_NAMES = ("num_experts", "n_experts", "n_routed_experts", "num_global_experts")


def global_experts(block: Any, gate: Any, local: int) -> int:
    """The layer's number of experts over all ranks: ``local`` (the experts this rank holds),
    or more when the block or its gate says so (an EP block keeps only its local experts, while
    its router scores all of them: DeepSpeed's gate ``wg`` is ``Linear(d, num_experts)``)."""
    seen: list[int] = []
    for obj in (block, gate):
        seen.extend(v for a in GLOBAL_NAMES if isinstance(v := getattr(obj, a, None), int)
                    and not isinstance(v, bool))
    ep_size, n_local = getattr(block, "ep_size", None), getattr(block, "num_local_experts", None)
    if isinstance(ep_size, int) and isinstance(n_local, int):
        seen.append(ep_size * n_local)
    seen.extend(_out_features(gate))
    return next((n for n in seen if n > local and n % local == 0), local)


def _out_features(gate: Any) -> list[int]:
    """A Linear gate's (or its one Linear child's: DeepSpeed's ``wg``) output size."""
    out = []
    for obj in (gate, *getattr(gate, "_modules", {}).values()):
        v = getattr(obj, "out_features", None)
        if isinstance(v, int):
            out.append(v)
    return out


def expert_owners(torch: Any, block: Any, experts: Any, n: int) -> list[int] | None:
    """The global rank holding each of the layer's ``n`` experts, or None (not expert-parallel,
    or a layout this does not read)."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    got = _from_sharded_weights(torch, experts, n)
    if got is None:
        got = _from_group(dist, block, experts, n)
    return got if got is not None and len(set(got)) > 1 else None


def _from_sharded_weights(torch: Any, experts: Any, n: int) -> list[int] | None:
    try:
        from torch.distributed.tensor import DTensor, Shard
    except ImportError:
        return None
    for p in experts.parameters():
        if not isinstance(p, DTensor) or p.dim() < 1 or p.shape[0] != n:
            continue
        for dim, placement in enumerate(p.placements):
            if isinstance(placement, Shard) and placement.dim == 0:
                mesh = p.device_mesh
                ranks = torch.distributed.get_process_group_ranks(mesh.get_group(dim))
                return _contiguous(ranks, n)
        return None  # sharded otherwise (tensor parallel inside each expert): every rank
    return None


def _from_group(dist: Any, block: Any, experts: Any, n: int) -> list[int] | None:
    for obj in (block, experts, getattr(block, "args", None), getattr(block, "config", None),
                getattr(experts, "args", None)):
        if obj is None:
            continue
        for a in GROUP_NAMES:
            group = getattr(obj, a, None)
            if group is not None and isinstance(group, dist.ProcessGroup):
                return _contiguous(dist.get_process_group_ranks(group), n)
    return None


def _contiguous(ranks: list[int], n: int) -> list[int] | None:
    """Expert e on ``ranks[e // (n / len(ranks))]``; None when n does not split evenly."""
    if not ranks or n % len(ranks):
        return None
    per = n // len(ranks)
    return [int(ranks[e // per]) for e in range(n)]
