"""`probe checkpoint PATH` of a DeepSpeed job: weights that load, and the optimizer state as
DeepSpeed itself saves it.

Runs on every rank at the same step boundary (after ``engine.step()`` returned: clock.py),
because both halves are collectives:

- **PATH** (rank 0, ``torch.save``): ``{"probe_checkpoint": 1, "step", "world_size", "framework",
  "zero_stage", "model": one consolidated fp32 state dict, "scheduler": engine.lr_scheduler's
  state, "optimizer_checkpoint": {"directory", "tag"}, "written": {...}, "names", "rng"}``.
  The model's parameters are assembled from every rank's fp32 master partition
  (``deepspeed.utils.safe_get_full_fp32_param``: an all-gather under ZeRO-3, where each rank's
  ``param`` is an empty tensor and ``state_dict()`` saved ``torch.Size([0])`` for every weight);
  buffers come from the module. So ``GPT().load_state_dict(state["model"])`` loads strictly into
  a fresh model of the same class, with no DeepSpeed.
- **PATH.deepspeed/** (every rank): ``engine.save_checkpoint``, i.e. DeepSpeed's own sharded
  checkpoint: each rank writes its optimizer partition (a ZeRO optimizer's state is flat
  partitions that only DeepSpeed can map back to parameters; saving rank 0's alone would be a
  silent fraction of it). ``engine.load_checkpoint(DIR, tag)`` resumes it;
  ``python DIR/zero_to_fp32.py DIR OUT`` consolidates it offline.
- ``PATH.rng.rank{r}``: every rank's generators, as for a replicated checkpoint.

Every rank checks its destinations, then one ``all_reduce`` of "may I write" decides for all:
a rank that refused alone would leave the others waiting in the next collective for ever.
Refused with one line: a pipeline-parallel engine (its layers live on different ranks), and an
existing ``PATH.deepspeed``.
"""

from __future__ import annotations

import os
from typing import Any

from .checkpoint import FORMAT, rng_state, write_atomic
from .checkpoint_target import CheckpointError, check_destination


def save(path: str, *, engine: Any, model: Any, step: int, rank: int, world_size: int,
         tag: str, schedulers: list[Any], overwrite: bool, framework: str,
         names: dict[str, list[str]]) -> dict[str, Any]:
    """Write this rank's part (see the module docstring); returns the action's ``data``."""
    import torch.distributed as dist

    path = os.path.abspath(path)
    ds_dir = f"{path}.deepspeed"
    rng_path = f"{path}.rng.rank{rank}"
    _agree(lambda: _check(path, ds_dir, rng_path, engine, rank, world_size, overwrite), dist)
    stage = _zero_stage(engine)
    full = consolidated_state_dict(model, stage)
    ds_tag = f"global_step{getattr(engine, 'global_steps', step)}"
    tmp_dir = f"{ds_dir}.tmp-{tag}"
    engine.save_checkpoint(tmp_dir, tag=ds_tag, client_state={"probe_step": step})
    if dist.is_initialized():
        dist.barrier()  # every rank's shard is on disk before rank 0 names the directory
    written = {
        "model": f"consolidated fp32 state dict of {type(model).__name__} ({len(full)} "
                 f"tensors, gathered from ZeRO-{stage}), loads strictly into a fresh model",
        "optimizer": f"DeepSpeed's sharded checkpoint {ds_dir} (tag {ds_tag}, every rank's "
                     "partition): engine.load_checkpoint(dir, tag) resumes it; "
                     f"python {ds_dir}/zero_to_fp32.py {ds_dir} OUT consolidates it",
        "scheduler": (f"{type(schedulers[0]).__name__} state" if schedulers
                      else "none (the engine has no LR scheduler)"),
    }
    files = []
    if rank == 0:
        os.rename(tmp_dir, ds_dir)
        state: dict[str, Any] = {
            "probe_checkpoint": FORMAT, "step": step, "world_size": world_size,
            "framework": framework, "zero_stage": stage, "names": names, "model": full,
            "optimizer_checkpoint": {"directory": ds_dir, "tag": ds_tag},
            "written": written, "rng": rng_state(),
        }
        if len(schedulers) == 1:
            state["scheduler"] = schedulers[0].state_dict()
        elif schedulers:
            state["schedulers"] = [s.state_dict() for s in schedulers]
        files.append({"path": path, "bytes": write_atomic(path, state, tag, overwrite)})
        files.append({"path": ds_dir, "bytes": _tree_bytes(ds_dir)})
    if world_size > 1:
        rng = {"probe_checkpoint": FORMAT, "step": step, "rank": rank, "rng": rng_state()}
        files.append({"path": rng_path, "bytes": write_atomic(rng_path, rng, tag, overwrite)})
    return {"mode": f"deepspeed ZeRO-{stage}", "step": step, "files": files, "names": names,
            "written": written, "directory": ds_dir}


def consolidated_state_dict(model: Any, stage: int) -> dict[str, Any]:
    """The model's full fp32 state dict on every rank (a collective per parameter under
    ZeRO-3: call it on every rank in the same order, which ``named_parameters`` gives)."""
    from deepspeed.utils import safe_get_full_fp32_param

    keys = list(model.state_dict().keys())  # under ZeRO-3 the values are empty: keys only
    params: dict[int, Any] = {}
    by_name: dict[str, Any] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) not in params:  # a tied weight is gathered once
            full = safe_get_full_fp32_param(p)
            if full is None:  # not under the optimizer (frozen): the module's own copy
                full = _gathered(p, stage)
            params[id(p)] = full.detach().float().cpu().clone()
        by_name[name] = params[id(p)]
    buffers = dict(model.named_buffers(remove_duplicate=False))
    out = {}
    for k in keys:
        value = by_name.get(k, buffers.get(k))
        if value is None:
            raise CheckpointError(f"{k}: neither a parameter nor a buffer of "
                                  f"{type(model).__name__}; nothing was written")
        out[k] = value.detach().cpu().clone() if k not in by_name else value
    return out


def _gathered(p: Any, stage: int) -> Any:
    if stage == 3 and hasattr(p, "ds_id"):
        import deepspeed

        with deepspeed.zero.GatheredParameters([p]):
            return p.detach().clone()
    return p.detach()


def _check(path: str, ds_dir: str, rng_path: str, engine: Any, rank: int, world_size: int,
           overwrite: bool) -> None:
    if type(engine).__name__ == "PipelineEngine":
        raise CheckpointError(
            "a pipeline-parallel DeepSpeed engine holds different layers on different ranks: "
            "probe cannot consolidate it; call engine.save_checkpoint(DIR) in the script")
    if rank == 0:
        check_destination(path, overwrite=overwrite, layout="file")
    if os.path.lexists(ds_dir):
        raise CheckpointError(f"{ds_dir} exists (DeepSpeed's sharded optimizer checkpoint of "
                              "this PATH): give a new path; nothing was written")
    if world_size > 1:
        check_destination(rng_path, overwrite=overwrite, layout="file")


def _agree(check: Any, dist: Any) -> None:
    """Run ``check`` on every rank; if any rank refused, every rank raises (no rank may go on
    into the save's collectives alone)."""
    err: CheckpointError | None = None
    try:
        check()
    except CheckpointError as e:
        err = e
    if dist.is_initialized() and dist.get_world_size() > 1:
        import torch

        flag = torch.tensor([0 if err is not None else 1], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if err is None and int(flag.item()) == 0:
            err = CheckpointError("another rank refused this checkpoint (its reason is in its "
                                  "own result); nothing was written")
    if err is not None:
        raise err


def _zero_stage(engine: Any) -> int:
    try:
        return int(engine.zero_optimization_stage())
    except (AttributeError, TypeError, ValueError):
        return 0


def _tree_bytes(directory: str) -> int:
    total = 0
    for root, _, files in os.walk(directory):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total
