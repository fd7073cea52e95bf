"""RowResolver: raw tracer rows -> Arrow tables for ``python.torch_trace`` (writer thread only).

The training thread records as little as it can (``modules.py``): two ``perf_counter_ns``
stamps, the module object, the root call around it, the step, and for backward only the time a
``grad_fn`` pre-hook fired. Everything else happens here, off the training thread:

- **names**: a module's qualified name in its root model (``layers.3.attn``), from the root's
  ``named_modules()`` (indexed once per root). Wrapper prefixes are dropped (``_orig_mod.`` of
  ``torch.compile``, ``module.`` of DDP, FSDP's and checkpoint-wrapper's inner names), so a
  compiled or wrapped model reports the names of the plain one. The root itself is named by its
  class (``GPT``), and ``root`` tells several root models apart (``GPT``, ``GPT#2``).
- **seq**: the call index of a module within its step and stage (0, 1, … for a module called
  several times: shared layers, gradient accumulation).
- **backward spans**: a span starts at its pre-hook and ends at the next pre-hook (or pass end)
  of a call that is neither nested in it nor around it in the forward; recompute calls never end
  spans of the original forward.
- **CUDA**: durations from event pairs once both events completed (``query()``); rows whose
  events are not done yet wait for the next tick (never a synchronize).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import pyarrow as pa

T0, T1, OBJ, ROOT, STEP, KIND, EV0, EV1, MEM, DEPTH = range(10)
INFO = 10  # appended once resolved: (module name, root label, seq)
OPT_STEP = 2
_NS = 1e-9
_MAX_PENDING = 50_000

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

#: Wrapper classes whose one child is the real model: attribute of the child.
_WRAPPERS = {"OptimizedModule": "_orig_mod", "DistributedDataParallel": "module",
             "DataParallel": "module"}
#: Name components that wrappers insert at any depth.
_INNER = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")


class RowResolver:
    """Turns raw rows and backward events into Arrow; keeps the small state that needs
    (module names, per-step call counters, rows whose CUDA events are still running)."""

    def __init__(self, rank: int, config: Any) -> None:
        self.rank = rank
        self.torch: Any = None
        # perf_counter_ns -> seconds since the epoch
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self._names: dict[int, tuple[Any, str, str]] = {}
        self._labels: dict[int, tuple[Any, str]] = {}
        self._label_counts: dict[str, int] = {}
        self._seq: dict[tuple[int, int, int], int] = {}
        self._seq_steps: set[int] = set()
        self._pending: list[tuple[Any, ...]] = []

    # -- names -------------------------------------------------------------------------------
    def _label(self, root: Any) -> str:
        hit = self._labels.get(id(root))
        if hit is not None and hit[0]() is root:
            return hit[1]
        inner = getattr(root, _WRAPPERS.get(type(root).__name__, ""), root)
        base = type(inner).__name__
        n = self._label_counts.get(base, 0) + 1
        self._label_counts[base] = n
        label = base if n == 1 else f"{base}#{n}"
        self._labels[id(root)] = (weakref.ref(root), label)
        return label

    def _index(self, root: Any) -> None:
        label = self._label(root)
        wrapper_attr = _WRAPPERS.get(type(root).__name__)
        try:
            named = list(root.named_modules())
        except RuntimeError:  # the training thread changed the model while we walked it
            return
        for name, m in named:
            parts = [p for p in name.split(".") if p not in _INNER]
            if wrapper_attr == "module" and parts[:1] == ["module"]:
                parts = parts[1:]
            clean = ".".join(parts)
            if m is root and wrapper_attr in ("module",):
                clean = type(root).__name__  # DDP's own row; its inner model is the label
            self._names[id(m)] = (weakref.ref(m), clean or label, label)

    def name(self, obj: Any, root: Any) -> tuple[str, str]:
        """(qualified name, root label) of a module called inside ``root``'s call."""
        hit = self._names.get(id(obj))
        if hit is not None and hit[0]() is obj:
            return hit[1], hit[2]
        if len(self._names) > 100_000:
            self._names = {k: v for k, v in self._names.items() if v[0]() is not None}
        for candidate in (root, obj):
            if candidate is None:
                continue
            self._index(candidate)
            hit = self._names.get(id(obj))
            if hit is not None and hit[0]() is obj:
                return hit[1], hit[2]
        return type(obj).__name__, type(obj).__name__

    def _info(self, row: list[Any]) -> tuple[str, str, int]:
        if len(row) > INFO:
            return row[INFO]  # type: ignore[no-any-return]
        if row[KIND] == OPT_STEP:
            name, label = type(row[OBJ]).__name__, "optimizer"
        else:
            name, label = self.name(row[OBJ], row[ROOT])
        # Recompute calls count on their own, so a reentrant checkpoint's backward (which hangs
        # off the recompute call) gets the seq of the original forward call.
        key = (row[STEP], id(row[OBJ]), int(row[KIND]))
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        self._seq_steps.add(row[STEP])
        info = (name, label, seq)
        row.append(info)
        return info

    def _prune_seq(self) -> None:
        if len(self._seq_steps) <= 4:
            return
        keep = set(sorted(self._seq_steps)[-4:])
        self._seq = {k: v for k, v in self._seq.items() if k[0] in keep}
        self._seq_steps = keep

    # -- resolution --------------------------------------------------------------------------
    def resolve(
        self, rows: list[list[Any]], events: list[tuple[Any, ...]],
        recycle: Callable[[list[Any]], None],
    ) -> list[pa.Table]:
        cols: dict[str, list[Any]] = {f.name: [] for f in SCHEMA}
        done_events: list[Any] = []
        for row in rows:
            self._info(row)
            stage = "step" if row[KIND] == OPT_STEP else "forward"
            self._pending.append((row, stage, row[T0], row[T1], row[EV0], row[EV1], row[MEM]))
        self._backward(events)
        still: list[tuple[Any, ...]] = []
        for item in self._pending:
            row, stage, t0, t1, ev0, ev1, mem = item
            gpu = None
            if ev0 is not None and ev1 is not None:
                if not ev1.query():
                    still.append(item)
                    continue
                gpu = ev0.elapsed_time(ev1) / 1e3
                if stage != "backward":  # backward events may also end other spans
                    done_events += [ev0, ev1]
            self._add(cols, row, stage, t0, t1, gpu, mem)
        self._pending = still[-_MAX_PENDING:]
        if done_events:
            recycle(done_events)
        self._prune_seq()
        if not cols["timestamp"]:
            return []
        return [pa.table(cols, schema=SCHEMA)]

    def _backward(self, events: list[tuple[Any, ...]]) -> None:
        """Pair each backward start with the event that ends it; queue backward rows."""
        n = len(events)
        for i in range(n):
            t, rows, ev, mem = events[i]
            if rows is None:
                continue
            for r in rows:
                end_t, end_ev = None, None
                for j in range(i + 1, n):
                    tj, rows_j, ev_j, _ = events[j]
                    if rows_j is None or any(_ends(r, rj) for rj in rows_j):
                        end_t, end_ev = tj, ev_j
                        break
                if end_t is None:
                    continue  # the pass was cut (buffer cap): no honest end time
                self._info(r)
                self._pending.append((r, "backward", t, end_t, ev, end_ev, mem))

    def _add(
        self, cols: dict[str, list[Any]], row: list[Any], stage: str, t0: int, t1: int,
        gpu: float | None, mem: tuple[float, ...] | None,
    ) -> None:
        name, label, seq = self._info(row)
        cpu = (t1 - t0) * _NS
        cols["timestamp"].append((t0 + self._offset_ns) * _NS)
        cols["rank"].append(self.rank)
        cols["step"].append(row[STEP])
        cols["seq"].append(seq)
        cols["module"].append(name)
        cols["stage"].append(stage)
        cols["duration"].append(gpu if gpu is not None else cpu)
        cols["cpu_duration"].append(cpu)
        for k, v in zip(("allocated", "max_allocated", "cached", "max_cached"), mem or (0.0,) * 4):
            cols[k].append(v)
        cols["root"].append(label)
        # Only the recomputed forward is extra work; the backward happens once either way.
        cols["recompute"].append(stage == "forward" and row[KIND] == 1)
        cols["device"].append("cuda" if row[EV0] is not None else "cpu")
        cols["depth"].append(row[DEPTH])


def _ends(r: list[Any], other: list[Any]) -> bool:
    """Does the backward of ``other`` starting end the backward span of ``r``? Yes when their
    forward calls are disjoint (neither nested in the other), except that recompute calls
    (made during backward) never end a span of the original forward."""
    if other[KIND] == 1 and r[KIND] != 1:
        return False
    return other[T1] <= r[T0] or other[T0] >= r[T1]
