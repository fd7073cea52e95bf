"""`probe checkpoint PATH`: a consistent checkpoint taken at a step boundary on every rank.

Runs on the training thread right after optimizer step N (a step-boundary action, agreed by
every rank: see agreement.py), so model, optimizer and scheduler are all from step N.

Two layouts:

- **Replicated** (one process, DDP, DataParallel: every rank holds the whole model). Rank 0
  writes ``PATH`` with ``torch.save``::

      {"probe_checkpoint": 1, "step": N, "world_size": W,
       "model": state_dict            (or "models": {name: state_dict} for several roots),
       "optimizer": state_dict        (or "optimizers": [state_dict, ...]),
       "scheduler": state_dict        (or "schedulers": [...]; absent without one),
       "scaler": state_dict           (the AMP GradScaler's scale and growth tracker;
                                       absent without an enabled one),
       "rng": {"python", "torch", "numpy"?, "cuda"?},   # rank 0's generators
       "framework": "hf_trainer" | "lightning" | "accelerate" | "plain",
       "names": {"model": [...], "optimizer": [...], "scheduler": [...]}}

  The objects are those the framework really uses (probe_agent/frameworks): under the HF
  Trainer the torch optimizer inside ``trainer.optimizer`` and ``trainer.lr_scheduler``;
  ``model`` is the user's model unwrapped, so ``model.load_state_dict(state["model"])``,
  ``optimizer.load_state_dict(state["optimizer"])`` and ``scheduler.load_state_dict(
  state["scheduler"])`` on a fresh Trainer's (``create_optimizer_and_scheduler``) or
  LightningModule's (``configure_optimizers``) objects resume it.

  With W > 1 every rank r also writes its own generators to ``PATH.rng.rank{r}`` (ranks draw
  different data and dropout masks; no collective is used to gather them).
- **Sharded** (a parameter is a DTensor: FSDP2, tensor parallel; or an FSDP1 wrapper):
  ``torch.distributed.checkpoint`` writes the directory ``PATH`` from every rank, with
  ``get_state_dict`` for model and optimizers, ``step``, the scheduler states and ``rng.rank{r}``.

Never destructive: an existing file is replaced only with ``overwrite``; a device,
FIFO, socket or a directory never is (checkpoint_target.py has the rules, checked on submit and
again right before the rename). A full disk is refused before writing when ``statvfs`` says so,
and otherwise reported as "disk full" with the size needed, leaving no temporary file.

Atomic: every file is written to ``<name>.tmp-<action>`` (fsync'd) and renamed; a sharded
directory is written as ``PATH.tmp-<action>/`` and renamed by rank 0 once ``dcp.save`` returned
(the coordinator returns only after every rank's data and the metadata are written). A crash
mid-save leaves only ``*.tmp-*`` names, never a ``PATH`` that looks complete.

``load(PATH, rank)`` reads a replicated checkpoint back with that rank's generators merged in;
``restore_rng(state["rng"])`` puts them back.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

from .checkpoint_target import (
    check_destination,
    commit_directory,
    commit_file,
    disk_full,
    estimate_bytes,
    preflight,
)

FORMAT = 1


def rng_state() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    np = sys.modules.get("numpy")
    if np is not None:
        out["numpy"] = np.random.get_state()
    if torch.cuda.is_initialized():  # never create a CUDA context the job did not
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def restore_rng(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def is_sharded(models: list[Any]) -> bool:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        return False
    try:
        from torch.distributed.tensor import DTensor

        dtensor: tuple[type, ...] = (DTensor,)
    except ImportError:  # older torch
        dtensor = ()
    for m in models:
        for sub in m.modules():
            if type(sub).__name__ == "FullyShardedDataParallel":
                return True
        if dtensor and any(isinstance(p, dtensor) for p in m.parameters()):
            return True
    return False


def _one_or_many(key: str, items: list[Any]) -> dict[str, Any]:
    if not items:
        return {}
    return {key: items[0]} if len(items) == 1 else {key + "s": items}


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, obj: Any, tag: str, overwrite: bool = False) -> int:
    """torch.save to ``path`` through a temporary name; returns the size in bytes.

    ``path`` is checked (checkpoint_target.py) before anything is written and again right before
    the rename; a full disk is reported as such and leaves no temporary file.
    """
    import torch

    parent = os.path.dirname(os.path.abspath(path))
    check_destination(path, overwrite=overwrite, layout="file")
    needed = estimate_bytes(obj)
    os.makedirs(parent, exist_ok=True)
    preflight(parent, needed)
    tmp = f"{path}.tmp-{tag}"
    # O_EXCL | O_NOFOLLOW: never write through whatever already sits at the temporary name
    # (and so never unlink it below: only a file this call created is removed).
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o666)
    except OSError as e:  # out of inodes is ENOSPC too
        full = disk_full(e, parent, needed)
        if full is not None:
            raise full from e
        raise
    sink = _Sink(os.fdopen(fd, "wb"))
    try:
        with sink.f:
            # torch.save calls only write() and flush() on a file object; its annotation says
            # IO[bytes], which a two-method wrapper cannot claim without faking the rest
            torch.save(obj, sink)  # type: ignore[arg-type]
            sink.f.flush()
            os.fsync(sink.f.fileno())
        commit_file(tmp, path, overwrite=overwrite)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        full = disk_full(e, parent, needed, sink.error)
        if full is not None:
            raise full from e
        raise
    _fsync_dir(parent)
    return os.path.getsize(path)


class _Sink:
    """The file torch.save writes to, keeping the OSError it raised: torch.save reports a
    failed write as ``RuntimeError: [enforce fail at inline_container.cc:672]``, not ENOSPC."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return int(self.f.write(data))
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def checkpoint_names(models: list[tuple[str, Any]], optimizers: list[Any],
                     schedulers: list[Any], where: dict[int, str] | None) -> dict[str, list[str]]:
    """What was saved, named the way the job reaches each object."""
    return {
        "model": [n for n, _ in models],
        "optimizer": [checkpoint_label(o, where) for o in optimizers],
        "scheduler": [checkpoint_label(s, where) for s in schedulers],
    }


def checkpoint_label(o: Any, where: dict[int, str] | None) -> str:
    w = (where or {}).get(id(o))
    return f"{type(o).__name__} ({w})" if w else type(o).__name__


def save(
    path: str, *, step: int, rank: int, world_size: int, tag: str,
    models: list[tuple[str, Any]], optimizers: list[Any], schedulers: list[Any],
    overwrite: bool = False, framework: str | None = None, where: dict[int, str] | None = None,
    scaler: Any = None,
) -> dict[str, Any]:
    """Write this rank's part of the checkpoint; returns ``{"mode", "files": [{path, bytes}]}``.

    Args:
        framework: the framework the objects came from (``hf_trainer``), saved as is.
        where: ``id(obj) -> how the job reaches it``, for the names listed in the result.
        scaler: the job's AMP GradScaler; its ``state_dict()`` is saved as ``"scaler"`` when it
            is enabled (``scaler.load_state_dict(state["scaler"])`` resumes its scale).
        overwrite: replace an existing regular file (or, sharded, an existing checkpoint
            directory); without it an existing ``path`` is refused. A device, FIFO, socket or
            any other directory is refused either way (checkpoint_target.py).
    """
    path = os.path.abspath(path)
    names = checkpoint_names(models, optimizers, schedulers, where)
    scaler_state = scaler.state_dict() if scaler is not None and scaler.is_enabled() else None
    if scaler_state is not None:
        names["scaler"] = [checkpoint_label(scaler, where)]
    if is_sharded([m for _, m in models]):
        return _save_sharded(path, step=step, rank=rank, tag=tag, models=models,
                             optimizers=optimizers, schedulers=schedulers, names=names,
                             overwrite=overwrite, framework=framework,
                             scaler_state=scaler_state)
    # Each file is checked before this rank writes any (submit already checked them on every
    # rank, so a refusal here means something appeared at a path since then).
    if rank == 0:
        check_destination(path, overwrite=overwrite, layout="file")
    rng_path = f"{path}.rng.rank{rank}"
    if world_size > 1:
        check_destination(rng_path, overwrite=overwrite, layout="file")
    files = []
    if rank == 0:
        state: dict[str, Any] = {"probe_checkpoint": FORMAT, "step": step,
                                 "world_size": world_size, "names": names,
                                 "framework": framework}
        if len(models) == 1:
            state["model"] = models[0][1].state_dict()
        else:
            state["models"] = {n: m.state_dict() for n, m in models}
        state.update(_one_or_many("optimizer", [o.state_dict() for o in optimizers]))
        state.update(_one_or_many("scheduler", [s.state_dict() for s in schedulers]))
        if scaler_state is not None:
            state["scaler"] = scaler_state
        state["rng"] = rng_state()
        files.append({"path": path, "bytes": write_atomic(path, state, tag, overwrite)})
    if world_size > 1:
        rng = {"probe_checkpoint": FORMAT, "step": step, "rank": rank, "rng": rng_state()}
        files.append({"path": rng_path, "bytes": write_atomic(rng_path, rng, tag, overwrite)})
    return {"mode": "torch.save", "step": step, "files": files, "names": names}


def _save_sharded(
    path: str, *, step: int, rank: int, tag: str, models: list[tuple[str, Any]],
    optimizers: list[Any], schedulers: list[Any], names: dict[str, Any], overwrite: bool,
    framework: str | None = None, scaler_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    import shutil

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    check_destination(path, overwrite=overwrite, layout="directory")
    state: dict[str, Any] = {"step": step, f"rng.rank{rank}": rng_state(),
                             "framework": framework or ""}
    for name, model in models:
        mine = [o for o in optimizers if _owns(model, o)]
        msd, osd = get_state_dict(model, mine)
        key = "" if len(models) == 1 else f".{name}"
        state["model" + key] = msd
        state["optimizer" + key] = osd
    for i, s in enumerate(schedulers):
        state[f"scheduler.{i}"] = s.state_dict()
    if scaler_state is not None:
        state["scaler"] = scaler_state
    tmp = f"{path}.tmp-{tag}"
    try:
        dcp.save(state, checkpoint_id=tmp)  # collective: every rank of the job is here (agreed)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)  # every rank failed with it; any may clean up
        full = disk_full(e, os.path.dirname(path), None)
        if full is not None:
            raise full from e
        raise
    if rank == 0:
        commit_directory(tmp, path, overwrite=overwrite, tag=tag)
        _fsync_dir(os.path.dirname(path))
    where = path if rank == 0 else tmp  # other ranks may return before rank 0 renames
    files = []
    if rank == 0:
        for entry in sorted(os.listdir(path)):
            file = os.path.join(path, entry)
            files.append({"path": file, "bytes": os.path.getsize(file)})
    return {"mode": "torch.distributed.checkpoint", "step": step, "directory": path,
            "written_as": where, "files": files, "names": names}


def _owns(model: Any, optimizer: Any) -> bool:
    ids = {id(p) for p in model.parameters()}
    return any(id(p) in ids for g in optimizer.param_groups for p in g["params"])


def load(path: str, rank: int = 0) -> dict[str, Any]:
    """A replicated checkpoint with ``rank``'s generators as ``state["rng"]``.

    Uses ``weights_only=False``: the RNG states are Python and numpy objects. Load only files
    you wrote.
    """
    import torch

    state = torch.load(path, map_location="cpu", weights_only=False)
    rng_path = f"{path}.rng.rank{rank}"
    if rank != 0 or os.path.exists(rng_path):
        if os.path.exists(rng_path):
            state["rng"] = torch.load(rng_path, map_location="cpu", weights_only=False)["rng"]
        elif rank != 0:
            raise FileNotFoundError(f"{rng_path}: no generator state saved for rank {rank}")
    return state
