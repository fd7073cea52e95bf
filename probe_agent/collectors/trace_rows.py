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
        # id(row) -> (row, (module name, root label, seq)) for the last steps' forward rows:
        # their backward rows (often in a later flush) take the same name and seq.
        self._info_of: dict[int, tuple[tuple[Any, ...], tuple[str, str, int]]] = {}

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

    def _infos(self, rows: list[tuple[Any, ...]], objs: list[Any], roots: list[Any]) -> None:
        """Name every forward row and give it its seq; remember both for its backward row.

        Recompute calls count on their own (the key has the kind), so a reentrant checkpoint's
        backward (which hangs off the recompute call) gets the seq of the original forward.
        """
        names: dict[int, tuple[str, str]] = {}  # objs holds the modules: ids are stable here
        seq = self._seq
        steps = self._seq_steps
        info_of = self._info_of
        for row, obj, root in zip(rows, objs, roots):
            oid = id(obj)
            nl = names.get(oid)
            if nl is None:
                if row[KIND] == OPT_STEP:
                    nl = (type(obj).__name__, "optimizer")
                else:
                    nl = self.name(obj, root)
                names[oid] = nl
            key = (row[STEP], oid, row[KIND])
            q = seq.get(key, 0)
            seq[key] = q + 1
            steps.add(row[STEP])
            info_of[id(row)] = (row, (nl[0], nl[1], q))

    def _prune_seq(self) -> None:
        if len(self._seq_steps) <= 4:
            return
        keep = set(sorted(self._seq_steps)[-4:])
        self._seq = {k: v for k, v in self._seq.items() if k[0] in keep}
        self._info_of = {k: v for k, v in self._info_of.items() if v[0][STEP] in keep}
        self._seq_steps = keep

    # -- resolution --------------------------------------------------------------------------
    def resolve(
        self, rows: list[tuple[Any, ...]], objs: list[Any], roots: list[Any],
        events: list[tuple[Any, ...]], recycle: Callable[[list[Any]], None],
    ) -> list[pa.Table]:
        """Raw rows and backward events -> at most one Arrow table of finished rows.

        Column-wise on purpose: the writer holds the GIL while it runs, so per-row Python work
        here is time the training thread may wait for (measured: 5.4 µs per row row-wise,
        about a third of that column-wise).
        """
        self._infos(rows, objs, roots)
        # items: (row, stage, t0, t1, cuda seconds or None, memory or None, info)
        items: list[tuple[Any, ...]] = []
        waiting = self._pending
        info_of = self._info_of
        for row in rows:
            stage = "step" if row[KIND] == OPT_STEP else "forward"
            info = info_of[id(row)][1]
            if row[EV0] is None:
                items.append((row, stage, row[T0], row[T1], None, row[MEM], info))
            else:
                waiting.append(
                    (row, stage, row[T0], row[T1], row[EV0], row[EV1], row[MEM], info))
        self._backward(events, items, waiting)
        if waiting:
            items += self._cuda_ready(recycle)
        self._prune_seq()
        if not items:
            return []
        return [self._table(items)]

    def _cuda_ready(self, recycle: Callable[[list[Any]], None]) -> list[tuple[Any, ...]]:
        """Items whose CUDA events completed (``query()``, never a synchronize); the others
        wait for the next flush."""
        ready, still, done_events = [], [], []
        for item in self._pending:
            row, stage, t0, t1, ev0, ev1, mem, info = item
            if ev0 is None or ev1 is None:
                ready.append((row, stage, t0, t1, None, mem, info))
                continue
            if not ev1.query():
                still.append(item)
                continue
            ready.append((row, stage, t0, t1, ev0.elapsed_time(ev1) / 1e3, mem, info))
            if stage != "backward":  # backward events may also end other spans
                done_events += [ev0, ev1]
        self._pending = still[-_MAX_PENDING:]
        if done_events:
            recycle(done_events)
        return ready

    def _table(self, items: list[tuple[Any, ...]]) -> pa.Table:
        n = len(items)
        off = self._offset_ns
        cpu = [(it[3] - it[2]) * _NS for it in items]
        info = [it[6] for it in items]
        zeros = (0.0, 0.0, 0.0, 0.0)
        mem = [it[5] or zeros for it in items]
        return pa.table([
            [(it[2] + off) * _NS for it in items],
            [self.rank] * n,
            [it[0][STEP] for it in items],
            [i[2] for i in info],
            [i[0] for i in info],
            [it[1] for it in items],
            [c if it[4] is None else it[4] for c, it in zip(cpu, items)],
            cpu,
            [m[0] for m in mem], [m[1] for m in mem], [m[2] for m in mem], [m[3] for m in mem],
            [i[1] for i in info],
            # Only the recomputed forward is extra work; the backward happens once either way.
            [it[1] == "forward" and it[0][KIND] == 1 for it in items],
            ["cpu" if it[0][EV0] is None else "cuda" for it in items],
            [it[0][DEPTH] for it in items],
        ], schema=SCHEMA)

    def _backward(
        self, events: list[tuple[Any, ...]], items: list[tuple[Any, ...]],
        waiting: list[tuple[Any, ...]],
    ) -> None:
        """Pair each backward start with the event that ends it (the next start of a call
        disjoint from it in the forward, or the pass end) and queue the backward rows.

        A span of ``r`` ends at event j when j is the pass end or one of j's calls is disjoint
        from ``r`` in the forward (neither nested in it nor around it), except that recompute
        calls (made during backward) never end a span of the original forward.
        """
        info_of = self._info_of
        n = len(events)
        for i in range(n):
            t, rows, ev, mem = events[i]
            if rows is None:
                continue
            for r in rows:
                r0, r1, r_recompute = r[T0], r[T1], r[KIND] == 1
                end_t = end_ev = None
                for j in range(i + 1, n):
                    tj, rows_j, ev_j, _ = events[j]
                    if rows_j is None:
                        end_t, end_ev = tj, ev_j
                        break
                    for rj in rows_j:
                        if (rj[KIND] != 1 or r_recompute) and (rj[T1] <= r0 or rj[T0] >= r1):
                            end_t, end_ev = tj, ev_j
                            break
                    if end_t is not None:
                        break
                known = info_of.get(id(r))
                if end_t is None or known is None:
                    # the pass was cut (buffer cap): no honest end time; or the forward row
                    # was dropped at the buffer cap
                    continue
                if ev is None:
                    items.append((r, "backward", t, end_t, None, mem, known[1]))
                else:
                    waiting.append((r, "backward", t, end_t, ev, end_ev, mem, known[1]))
