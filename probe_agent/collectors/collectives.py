"""Collective recorder: every torch.distributed collective and point-to-point call of this rank.

What gets captured
------------------
Two sources, merged into ``python.collectives`` when a query names the table (nothing is written
on the training thread beyond one small record per explicit call):

- **Python wrappers** around the public ``torch.distributed`` functions (``all_reduce``,
  ``broadcast``, ``send``, ``barrier``, …). They see explicit calls only, with the Python call
  site, the wall-clock start and end of the call, and whether it is still running (``pending``),
  returned (``done``) or raised (``failed``). They are installed as soon as
  ``torch.distributed`` has been imported (checked on the writer tick, never importing torch
  ourselves). Code that bound a function before that (``from torch.distributed import
  all_reduce`` at import time) keeps the unwrapped one.
- **The Flight Recorder** (``torch._C._distributed_c10d._dump_fr_trace``; on by default in
  torch 2.13, 2,000 entries). It sees every collective the process group runs, including DDP's
  and FSDP's internal gradient reductions that never pass through the Python API, with the
  per-group sequence number, shapes, dtypes and a Python stack. On gloo it has no end times.

A wrapper record is matched to the Flight Recorder entry its call created (same group, the first
entry created after the call started); the row then carries the Flight Recorder's ``seq`` and
the wrapper's timing. Without a Flight Recorder the wrapper numbers calls per group itself.

Cost
----
One record (a list) per explicit call, in a bounded deque: a few microseconds. The Flight
Recorder dump (about 10 µs per entry) happens only when ``python.collectives`` is queried.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import sys
import threading
import time
from collections import deque
from typing import Any

from .. import patches
from . import Guard, Sink
from .collective_names import OP_NAMES, user_frame
from .flight_recorder import fr_state, read_flight_recorder
from .registry import CollectorSpec
from .torch_import import imported

log = logging.getLogger(__name__)

#: Public functions wrapped, by op name (as the Flight Recorder spells it after "gloo:").
WRAPPED = (
    "all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "all_gather",
    "all_gather_into_tensor", "all_gather_coalesced", "all_gather_object", "gather",
    "gather_object", "scatter", "scatter_object_list", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "broadcast_object_list",
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list",
)
P2P = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list",
                 "recv_object_list"})
TABLE = "python.collectives"
# Wrapper record slots (a list, not an object: cheaper to build on the training thread).
_PG, _OP, _SHAPES, _DTYPE, _START, _END, _STATE, _ERROR, _THREAD, _SITE, _SEQ, _ASYNC, _N = \
    range(13)


class CollectiveRecorder:
    """Collector for ``python.collectives``.

    Args:
        agent: its ``rank`` is written into every row (read at query time: the rank registry
            may correct it after ``init_process_group``).
        capacity: wrapper records kept (oldest dropped first); the Flight Recorder keeps its own
            2,000 (``TORCH_FR_BUFFER_SIZE``).
    """

    def __init__(self, rank: int, capacity: int = 4096) -> None:
        self.rank = rank
        self._schema: Any = None  # python.collectives as Arrow, from the sink
        self.records: deque[list[Any]] = deque(maxlen=capacity)
        self.guard = Guard("collective recorder")
        self._local = threading.local()
        self._seq: dict[str, int] = {}
        self._patched: list[patches.Patch] = []
        self._armed = False
        self._stopped = False
        self._lock = threading.Lock()
        #: the black box in the post-mortem directory (collective_strip.py), when there is one
        self.strip: Any = None
        self._n = 0

    def attach_strip(self, path: str) -> None:
        """Write every explicit call into ``path`` too (the post-mortem copy's black box)."""
        from .collective_strip import CollectiveStrip

        try:
            self.strip = CollectiveStrip(path)
        except (OSError, ValueError) as e:
            log.warning("probe agent: no collectives strip at %s (%s)", path, e)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, sink: Sink) -> None:
        self._schema = sink.arrow_schema(TABLE)
        sink.add_flusher(self.tick)
        sink.add_materializer(TABLE, self.snapshot)
        self.tick()

    def stop(self) -> None:
        with self._lock:
            # The writer keeps calling tick() until the store stops: it must not re-install.
            self._stopped = True
            try:
                for patch in reversed(self._patched):
                    patches.restore(patch)
            finally:
                self._patched.clear()
                self._armed = False
                strip, self.strip = self.strip, None
                if strip is not None:
                    strip.close()

    def tick(self) -> None:
        """Install the wrappers once ``torch.distributed`` is fully imported."""
        if self._armed or self._stopped:
            return
        c10d = imported("torch.distributed.distributed_c10d")
        dist = imported("torch.distributed")
        if c10d is None or dist is None:
            return  # not imported, or still being imported on another thread
        with self._lock:
            if not self._armed and not self._stopped:
                self._install(c10d, dist)
                self._armed = True

    def _install(self, c10d: Any, dist: Any) -> None:
        for op in WRAPPED:
            original = getattr(c10d, op, None)
            if original is None or patches.ours(original) is not None:
                continue
            wrapper = self._wrap(op, original)
            for module in (c10d, dist):
                if getattr(module, op, None) is original:
                    self._patched.append(patches.replace(
                        module, op, wrapper, by="collectives",
                        why="records each collective call (python.collectives)"))

    # -- the training-thread side --------------------------------------------------------------
    def _wrap(self, op: str, fn: Any) -> Any:
        params = list(inspect.signature(fn).parameters)
        group_at = params.index("group") if "group" in params else None
        async_at = params.index("async_op") if "async_op" in params else None
        is_async = op in ("isend", "irecv", "batch_isend_irecv")
        local, records, guard, seqs = self._local, self.records, self.guard, self._seq
        recorder = self

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # Nested calls (all_gather_object -> all_gather) are recorded once, outermost.
            if not guard.enabled or getattr(local, "inside", False):
                return fn(*args, **kwargs)
            rec = None
            try:
                group = kwargs.get("group")
                if group is None and group_at is not None and len(args) > group_at:
                    group = args[group_at]
                asynchronous = is_async or bool(
                    kwargs.get("async_op")
                    or (async_at is not None and len(args) > async_at and args[async_at])
                )
                rec = _begin(op, group, args, kwargs, asynchronous)
                if rec[_SEQ] is None:  # p2p, or a group without a sequence number
                    rec[_SEQ] = seqs[rec[_PG]] = seqs.get(rec[_PG], 0) + 1
                rec[_N] = recorder._n = recorder._n + 1
                records.append(rec)
                if recorder.strip is not None:
                    recorder.strip.put(rec[_N], _strip_values(rec))
            except Exception as e:  # noqa: BLE001 - see Guard: recording must never fail training
                guard.failed(e)
            local.inside = True
            try:
                out = fn(*args, **kwargs)
            except BaseException as e:
                if rec is not None:
                    rec[_END] = time.time()
                    rec[_STATE] = "failed"
                    first = str(e).splitlines()[0][:300] if str(e) else ""
                    rec[_ERROR] = f"{type(e).__name__}: {first}"
                    recorder._put(rec)
                raise
            finally:
                local.inside = False
            if rec is not None:
                rec[_END] = time.time()
                rec[_STATE] = "issued" if rec[_ASYNC] else "done"
                recorder._put(rec)
            return out

        return wrapper

    def _put(self, rec: list[Any]) -> None:
        strip = self.strip
        if strip is None or rec[_N] is None:
            return
        try:
            strip.put(rec[_N], _strip_values(rec))
        except Exception as e:  # noqa: BLE001 - see Guard
            self.guard.failed(e)

    # -- the query side ------------------------------------------------------------------------
    def snapshot(self) -> Any:
        """``python.collectives`` rows now: Flight Recorder entries merged with wrapper records."""
        import pyarrow as pa

        rows = self.rows()
        return pa.table({c: [r[c] for r in rows] for c in self._schema.names},
                        schema=self._schema)

    def rows(self) -> list[dict[str, Any]]:
        records = [list(r) for r in list(self.records)]
        groups = _group_ranks()
        fr = read_flight_recorder()
        out: list[dict[str, Any]] = []
        unmatched = records
        if fr is not None:
            entries, status = fr
            unmatched = _match(entries, records)
            oldest = min((e["start_time"] for e in entries), default=None)
            for e in entries:
                e["state"] = fr_state(e, status.get(e["pg"], {}))
                rec = e.pop("_rec", None)
                if rec is not None:
                    e.update(
                        start_time=rec[_START], end_time=rec[_END], state=_merged_state(e, rec),
                        error=rec[_ERROR], callsite=rec[_SITE] or e["callsite"], source="both",
                    )
                out.append(e)
            # Calls older than the Flight Recorder's window have no comparable seq: drop them.
            if oldest is not None:
                unmatched = [r for r in unmatched if r[_START] >= oldest or r[_STATE] == "pending"]
        for rec in unmatched:
            out.append(
                {
                    "pg": rec[_PG], "pg_desc": None, "seq": rec[_SEQ],
                    "op": OP_NAMES.get(rec[_OP], rec[_OP]),
                    "is_p2p": rec[_OP] in P2P, "shapes": rec[_SHAPES], "dtype": rec[_DTYPE],
                    "start_time": rec[_START], "end_time": rec[_END], "state": rec[_STATE],
                    "error": rec[_ERROR], "thread_name": rec[_THREAD], "callsite": rec[_SITE],
                    "source": "python",
                }
            )
        for row in out:
            row["rank"] = self.rank
            row["group_ranks"] = groups.get(row["pg"])
            end, start = row.get("end_time"), row.get("start_time")
            row["duration"] = end - start if end is not None and start is not None else None
            row.setdefault("pg_desc", None)
            row.setdefault("error", None)
        out.sort(key=lambda r: (r["start_time"] or 0.0))
        return out


def _strip_values(rec: list[Any]) -> list[Any]:
    """A record in probe_protocol.postmortem.STRIP_FIELDS order."""
    return [rec[_N], rec[_PG], rec[_SEQ], OP_NAMES.get(rec[_OP], rec[_OP]), rec[_SHAPES],
            rec[_DTYPE], rec[_START], rec[_END], rec[_STATE], rec[_ERROR], rec[_THREAD],
            rec[_SITE]]


def _begin(op: str, group: Any, args: tuple, kwargs: dict, asynchronous: bool) -> list[Any]:
    pg_obj = _group(group)
    pg = str(pg_obj.group_name)
    seq = None
    if op not in P2P:
        # The seq the Flight Recorder gives this call on every member (collective_seq_id).
        try:
            seq = int(pg_obj._get_sequence_number_for_group()) + 1
        except (AttributeError, RuntimeError, TypeError, ValueError):
            seq = None
    shapes: list[list[int]] = []
    dtype = None
    for value in (*args, *kwargs.values()):
        for t in value if isinstance(value, (list, tuple)) else (value,):
            shape = getattr(t, "shape", None)
            if shape is not None and hasattr(t, "dtype"):
                shapes.append(list(shape))
                dtype = dtype or str(t.dtype).removeprefix("torch.")
        if len(shapes) >= 8:
            break
    caller = user_frame(sys._getframe(2))
    site = f"{caller.f_code.co_filename}:{caller.f_lineno} {caller.f_code.co_name}"
    return [pg, op, json.dumps(shapes), dtype, time.time(), None, "pending", None,
            threading.current_thread().name, site, seq, asynchronous, None]


def _group(group: Any) -> Any:
    if group is None:
        c10d = sys.modules["torch.distributed.distributed_c10d"]
        group = c10d._get_default_group()
    return group


def _group_ranks() -> dict[str, list[int]]:
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None or not c10d.is_initialized():
        return {}
    out = {}
    for pg, name in list(c10d._world.pg_names.items()):
        try:
            out[str(name)] = sorted(c10d.get_process_group_ranks(pg))
        except (RuntimeError, ValueError, KeyError):
            continue
    return out


def _merged_state(e: dict[str, Any], rec: list[Any]) -> str:
    if rec[_STATE] == "failed":
        return "failed"
    if rec[_STATE] == "pending" or e["state"] == "pending":
        return "pending"
    return "done"


def _match(entries: list[dict[str, Any]], records: list[list[Any]]) -> list[list[Any]]:
    """Attach each wrapper record to the first Flight Recorder entry its call created.

    Same group, created at or after the call started and (when it has returned) before it
    returned. Returns the records that matched nothing.
    """
    by_pg: dict[str, list[dict[str, Any]]] = {}
    for e in sorted(entries, key=lambda e: e["start_time"]):
        by_pg.setdefault(e["pg"], []).append(e)
    unmatched = []
    cursor: dict[str, int] = {}
    for rec in sorted(records, key=lambda r: r[_START]):
        cands = by_pg.get(rec[_PG], [])
        i = cursor.get(rec[_PG], 0)
        while i < len(cands) and (
            cands[i]["start_time"] < rec[_START] - 1e-6 or "_rec" in cands[i]
        ):
            i += 1
        if i < len(cands) and (rec[_END] is None or cands[i]["start_time"] <= rec[_END] + 1e-6):
            cands[i]["_rec"] = rec
            cursor[rec[_PG]] = i + 1
        else:
            unmatched.append(rec)
    return unmatched


#: This collector, for the registry (registry.py).
COLLECTOR = CollectorSpec("collectives", 20, lambda b: CollectiveRecorder(b.rank),
                          tables=("python.collectives",))
