"""Columns: one flush of ``python.torch_trace`` rows, column by column, into one Arrow table.

The resolver (``trace_rows.py``) appends whole columns where it can (``extend``) and single rows
where it must (``add``: CUDA rows, rows with memory). Arithmetic and strings are Arrow kernels
over the whole flush, so the writer's per-row Python, which holds the GIL, stays small.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

# Row kinds (modules.py) and, for resolved rows only, BACKWARD.
FORWARD, RECOMPUTE, OPT_STEP, BACKWARD = range(4)
_STAGES = pa.array(["forward", "forward", "step", "backward"], pa.string())  # by kind
_DEVICES = pa.array(["cpu", "cuda"], pa.string())
# Typed scalars: pyarrow infers an untyped Python number's type by trying ``import dateutil``
# first, a failed import and a sys.path scan on every kernel call where it is not installed.
_NS_S = pa.scalar(1e-9, pa.float64())
_IS_RECOMPUTE = pa.scalar(RECOMPUTE, pa.int8())
_ZERO = pa.scalar(0.0, pa.float64())
_CPU = pa.scalar("cpu", pa.string())

SCHEMA = pa.schema(
    [
        ("timestamp", pa.float64()),
        ("rank", pa.int32()),
        ("step", pa.int64()),
        ("seq", pa.int32()),
        ("module", pa.string()),
        ("stage", pa.string()),
        ("duration", pa.float64()),
        ("cpu_duration", pa.float64()),
        ("allocated", pa.float64()),
        ("max_allocated", pa.float64()),
        ("cached", pa.float64()),
        ("max_cached", pa.float64()),
        ("root", pa.string()),
        ("recompute", pa.bool_()),
        ("device", pa.string()),
        ("depth", pa.int32()),
    ]
)


class Columns:
    """The rows of one flush, column by column (Python lists until ``table``)."""

    def __init__(self) -> None:
        self.t0: list[int] = []
        self.t1: list[int] = []
        self.step: list[int] = []
        self.seq: list[int] = []
        self.code: list[int] = []
        self.kind: list[int] = []  # FORWARD, RECOMPUTE, OPT_STEP or BACKWARD
        self.depth: list[int] = []
        # Filled only once a CUDA row (or a row with memory) arrives; earlier rows get None.
        self.cuda_s: list[float | None] | None = None  # None in it: the row's cpu time
        self.mem: list[Any] | None = None

    def extend(self, t0: Any, t1: Any, step: Any, seq: Any, code: Any, kind: Any,
               depth: Any) -> None:
        n = len(t0)
        for col, vals in ((self.t0, t0), (self.t1, t1), (self.step, step), (self.seq, seq),
                          (self.code, code), (self.kind, kind), (self.depth, depth)):
            col.extend(vals)
        if self.cuda_s is not None:
            self.cuda_s.extend([None] * n)
        if self.mem is not None:
            self.mem.extend([None] * n)

    def add(self, t0: int, t1: int, step: int, seq: int, code: int, kind: int,
            cuda_s: float | None, mem: Any, depth: int, cuda: bool = False) -> None:
        n = len(self.t0)
        if cuda and self.cuda_s is None:
            self.cuda_s = [None] * n
        if mem is not None and self.mem is None:
            self.mem = [None] * n
        self.t0.append(t0)
        self.t1.append(t1)
        self.step.append(step)
        self.seq.append(seq)
        self.code.append(code)
        self.kind.append(kind)
        self.depth.append(depth)
        if self.cuda_s is not None:
            self.cuda_s.append(cuda_s)
        if self.mem is not None:
            self.mem.append(mem)

    def table(self, rank: int, offset_ns: int, names: tuple[pa.Array, pa.Array]) -> pa.Table:
        n = len(self.t0)
        t0 = pa.array(self.t0, pa.int64())
        # int64 -> float64 rounds to nearest, like Python's int * float
        cpu = pc.multiply(pc.cast(pc.subtract(pa.array(self.t1, pa.int64()), t0), pa.float64(),
                                  safe=False), _NS_S)
        ts = pc.multiply(pc.cast(pc.add(t0, pa.scalar(offset_ns, pa.int64())), pa.float64(),
                                 safe=False), _NS_S)
        kind = pa.array(self.kind, pa.int8())
        code = pa.array(self.code, pa.int32())
        if self.cuda_s is not None:
            gpu = pa.array(self.cuda_s, pa.float64())
            duration = pc.coalesce(gpu, cpu)
            device = _DEVICES.take(pc.cast(pc.is_valid(gpu), pa.int8()))
        else:
            duration = cpu
            device = pa.repeat(_CPU, n)
        if self.mem is not None:
            zeros = (0.0, 0.0, 0.0, 0.0)
            mem = [m or zeros for m in self.mem]
            mems = [pa.array([m[i] for m in mem], pa.float64()) for i in range(4)]
        else:
            mems = [pa.repeat(_ZERO, n)] * 4
        return pa.Table.from_arrays([
            ts,
            pa.repeat(pa.scalar(rank, pa.int32()), n),
            pa.array(self.step, pa.int64()),
            pa.array(self.seq, pa.int32()),
            names[0].take(code),
            _STAGES.take(kind),
            duration,
            cpu,
            *mems,
            names[1].take(code),
            # Only the recomputed forward is extra work; the backward happens once either way.
            pc.equal(kind, _IS_RECOMPUTE),
            device,
            pa.array(self.depth, pa.int32()),
        ], schema=SCHEMA)
