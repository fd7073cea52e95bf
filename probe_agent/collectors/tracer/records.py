"""The tracer's record buffers: one object the training thread appends to and the writer takes from.

The training thread appends (the hot path in trace_hot.py, per module call and backward event;
the step boundaries in trace_steps.py, per optimizer step); the writer thread takes whole
records off the front (``take``, trace_flush.py) and resolves them into rows (trace_rows.py).
Nothing else touches the buffers, and no lock guards them (why that is safe: ``take_front``). The
record formats are trace_columns.py's; the C++ hot path keeps its own buffers, which ``take``
empties into the same take, after the Python ones.

On CUDA steps (the Python hot path only) each record also gets CUDA events, kept here beside
the numbers: a pair per forward record (``fcuda``), one per backward event (``bcuda``), and the
allocator's numbers read at the same moment. They are never synchronised on: the writer reads
their times once the end event completed and hands them back for reuse (``recycle``).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .trace_columns import (
    BUFFER_ROWS,
    BW_CUDA,
    BW_GSEQ,
    BW_N,
    FW_CUDA,
    FW_MAX,
    FW_N,
    PASS_END,
    pack_bw,
    pack_fw,
)

#: Spare CUDA events kept for reuse; beyond it the writer's returned ones are dropped.
EVENT_POOL = 4096


@dataclass
class Take:
    """One take of whole records (``Records.take``): what ``RowResolver.resolve`` reads."""

    fw: array  # forward records (FW_*), Python's then the C++ path's
    objs: list[Any]  # the module (or optimizer) of each forward record
    roots: list[Any]  # the root call around each forward record
    fcuda: list[Any]  # (ev0, ev1, memory) of the forward records flagged FW_CUDA, in order
    bw: array  # backward events (BW_*), whole passes only
    bcuda: list[Any]  # (event, memory) of the backward events flagged BW_CUDA, in order


class Records:
    """The buffers, the rows dropped when they were full, and the CUDA event pool.

    Args:
        clock: the tracer's clock (``perf_counter_ns``): backward events are stamped with it.
    """

    __slots__ = ("fw", "objs", "roots", "fcuda", "bw", "bcuda", "dropped", "clock", "torch",
                 "_events")

    def __init__(self, clock: Callable[[], int]) -> None:
        self.fw = array("q")  # forward records (FW_*)
        self.objs: list[Any] = []  # the module (or optimizer) of forward record i
        self.roots: list[Any] = []  # the root module around forward record i
        self.fcuda: list[Any] = []  # (ev0, ev1, memory) of the records flagged FW_CUDA
        self.bw = array("q")  # backward events (BW_*)
        self.bcuda: list[Any] = []  # (event, memory) of the events flagged BW_CUDA
        self.dropped = 0  # records not kept: the buffer was full (and the C++ path's)
        self.clock = clock
        self.torch: Any = None  # set when the tracer arms: CUDA events come from it
        self._events: list[Any] = []  # spare CUDA events

    # -- training thread ----------------------------------------------------------------------
    def add_step(self, optimizer: Any, t0: int, t1: int, step: int, kind: int,
                 ev0: Any) -> None:
        """An optimizer step's record (trace_steps.py); ``ev0``: its start event on a CUDA
        step. The hot path appends module calls inline instead (trace_hot.traced_call)."""
        if len(self.fw) >= FW_MAX:
            return
        # objects first, record last: the writer takes as many objects as records
        self.objs.append(optimizer)
        self.roots.append(None)
        cuda = 0
        if ev0 is not None:
            self.fcuda.append((ev0, self.record_event(), self.memory()))
            cuda = 1
        self.fw.frombytes(pack_fw(t0, t1, step, kind, 0, -1, cuda, -1))

    def record_bw_cuda(self, gseq: int, memory: bool) -> None:
        """One backward event on a CUDA step: node ``gseq`` (or PASS_END) with a CUDA event,
        and the allocator's numbers when ``memory``, in ``bcuda``."""
        t = self.clock()
        cuda = 0
        ev = self.record_event()
        if ev is not None:
            self.bcuda.append((ev, self.memory() if memory else None))
            cuda = 1
        self.bw.frombytes(pack_bw(t, gseq, cuda))

    def record_event(self) -> Any:
        """A recorded CUDA event from the pool, or None during stream capture."""
        torch = self.torch
        if torch.cuda.is_current_stream_capturing():
            return None
        ev = self._events.pop() if self._events else torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def memory(self) -> tuple[float, float, float, float] | None:
        """(allocated, max_allocated, cached, max_cached) in MiB on the current CUDA device."""
        torch = self.torch
        s = torch._C._cuda_memoryStats(torch.cuda.current_device())
        a, r = s["allocated_bytes"]["all"], s["reserved_bytes"]["all"]
        mib = 1 / (1 << 20)
        return (a["current"] * mib, a["peak"] * mib, r["current"] * mib, r["peak"] * mib)

    # -- writer thread ------------------------------------------------------------------------
    def pending(self, native: Any) -> tuple[int, int]:
        """(forward records, backward events of the C++ path) buffered now; ``native``: the
        C++ hot path while the tracer is bound to it, else None."""
        records, events = len(self.fw) // FW_N, 0
        if native is not None:
            _, _, _, n_fw, events = native.state()
            records += n_fw
        return records, events

    def take(self, native: Any) -> Take:
        """Take every whole record off the buffers (and the C++ path's, ``native``)."""
        # Events first, rows second: every backward event taken then refers to forward rows
        # that were recorded before it, so they are in this take (or an earlier one).
        # Backward spans end at the next event: only take events up to the last pass end.
        n = len(self.bw) // BW_N
        gseqs = self.bw[BW_GSEQ:n * BW_N:BW_N]
        gseqs.reverse()
        cut = n - gseqs.index(PASS_END) if PASS_END in gseqs else 0
        if cut == 0 and n > BUFFER_ROWS // 2:
            cut = n  # a backward that never ends (or a lost callback): do not grow forever
        bw = take_front(self.bw, cut * BW_N)
        bcuda = take_front(self.bcuda, bw[BW_CUDA::BW_N].count(1))
        n = len(self.fw) // FW_N  # records come after their objects: the lists hold >= n
        fw = take_front(self.fw, n * FW_N)
        objs, roots = take_front(self.objs, n), take_front(self.roots, n)
        fcuda = take_front(self.fcuda, fw[FW_CUDA::FW_N].count(1))
        if native is not None:
            # after the Python path's: the native records come from later steps, or from the
            # same step with other kinds (optimizer rows are Python's), and carry no CUDA
            nbw, nfw, nobjs, nroots, fw_dropped, bw_dropped = native.take()
            bw.frombytes(nbw)
            fw.frombytes(nfw)
            objs += nobjs
            roots += nroots
            self.dropped += fw_dropped + bw_dropped
        return Take(fw, objs, roots, fcuda, bw, bcuda)

    def recycle(self, events: list[Any]) -> None:
        """Events whose times were read go back to the pool."""
        if len(self._events) < EVENT_POOL:
            self._events.extend(events)


def take_front(buf: Any, n: int) -> Any:
    """Remove and return the first ``n`` items of a list or array. Lock-free: ``buf[:n]`` and
    ``del buf[:n]`` are single C calls under the GIL, and the training thread only appends
    (at index >= n), each record with one ``frombytes``."""
    if n <= 0:
        return buf[:0]
    out = buf[:n]
    del buf[:n]
    return out
