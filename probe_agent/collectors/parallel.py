"""ParallelWatcher: the job's tensor/pipeline-parallel layout -> ``python.parallel``, so that the
data-parallel world (and GB_tok) counts each data-parallel replica once.

Where it is read, first found wins:

- a ``torch.distributed.device_mesh.DeviceMesh`` (found on the heap, heapscan.py): the root
  mesh this rank belongs to, its dims by name: ``tp``/``tensor`` are tensor parallel,
  ``pp``/``pipe``/``pipeline`` pipeline parallel, the rest (dp, dp_shard, dp_replicate, fsdp,
  cp, ...) count as data parallel (each of their ranks feeds its own tokens);
- Megatron's ``megatron.core.parallel_state`` when the program imported it and initialised it
  (tensor and pipeline model-parallel world sizes);
- DeepSpeed's ``PipelineEngine`` (``num_stages``) when the program imported it.

None found: the row says so (``source`` NULL), and `probe throughput` says the data-parallel
world is assumed to be the ranks of the process group. Read at the first optimizer step seen
and at steps 10, 100, 1000, ...: a heap walk (50-100 ms on a large job, other threads wait)
is too dear for every step, and a layout does not change while the job runs.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from .rare_reads import RareReader
from .registry import CollectorSpec

TABLE = "python.parallel"
TP_NAMES = frozenset({"tp", "tensor", "tensor_parallel"})
PP_NAMES = frozenset({"pp", "pipe", "pipeline", "pipeline_parallel"})
#: Reads per run: at the first step seen, then steps 10 and 100 (a mesh built late); each
#: walks the heap (about 90 ms with 325k objects, bench/bench_schedule_pauses.py).
READS = 3


class ParallelWatcher(RareReader):
    """Collector for python.parallel: at the first step seen, then steps 10 and 100."""

    table = TABLE
    name = "parallel layout"
    max_reads = READS

    def read(self, step: int, frame: Any) -> list[tuple[Any, ...]]:
        return [(time.time(), self.rank, step, *layout())]


def layout() -> tuple[Any, ...]:
    """``(source, mesh, tp, pp, world)``; a process without a process group is a world of 1."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None, None, 1, 1, 1
    world = dist.get_world_size()
    for read in (_device_mesh, _megatron, _deepspeed_pipe):
        got = read(dist)
        if got is not None:
            source, mesh, tp, pp = got
            return source, mesh, tp, pp, world
    return None, None, 1, 1, world


def _device_mesh(dist: Any) -> tuple[str, str, int, int] | None:
    dm = sys.modules.get("torch.distributed.device_mesh")
    cls = getattr(dm, "DeviceMesh", None)
    if cls is None:
        return None
    from ..heapscan import live_objects

    me = dist.get_rank()
    meshes = []
    for m in live_objects({"mesh": (cls,)})["mesh"]:
        root = getattr(m, "_root_mesh", None)
        names = getattr(m, "mesh_dim_names", None)
        if (root is not None and root is not m) or not names:
            continue
        if me not in m.mesh.flatten().tolist():
            continue
        meshes.append(m)
    if not meshes:
        return None
    m = max(meshes, key=lambda x: x.mesh.numel())
    sizes = dict(zip(m.mesh_dim_names, m.mesh.shape))
    tp = _prod(v for k, v in sizes.items() if k.lower() in TP_NAMES)
    pp = _prod(v for k, v in sizes.items() if k.lower() in PP_NAMES)
    text = ", ".join(f"{k}={v}" for k, v in sizes.items())
    return "DeviceMesh", text, tp, pp


def _megatron(dist: Any) -> tuple[str, str, int, int] | None:
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None or not ps.model_parallel_is_initialized():
        return None
    tp = int(ps.get_tensor_model_parallel_world_size())
    pp = int(ps.get_pipeline_model_parallel_world_size())
    return "megatron parallel_state", f"tp={tp}, pp={pp}", tp, pp


def _deepspeed_pipe(dist: Any) -> tuple[str, str, int, int] | None:
    eng = sys.modules.get("deepspeed.runtime.pipe.engine")
    cls = getattr(eng, "PipelineEngine", None)
    if cls is None:
        return None
    from ..heapscan import live_objects

    found = live_objects({"engine": (cls,)})["engine"]
    if not found:
        return None
    pp = int(getattr(found[0], "num_stages", 1) or 1)
    return "deepspeed PipelineEngine", f"pp={pp}", 1, pp


def _prod(values: Any) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


#: This collector, for the registry (registry.py).
COLLECTOR = CollectorSpec("parallel", 80, lambda b: ParallelWatcher(b.clock, b.rank),
                          tables=("python.parallel",))
