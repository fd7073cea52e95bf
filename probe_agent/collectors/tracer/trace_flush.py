"""The tracer's writer-thread side: when to resolve the training thread's records into rows,
and taking them off its buffers without a lock.

Mixed into ``TorchTracer`` (tracer.py), whose state it reads: the record buffers (``fw``,
``bw``, ``objs``, ``roots``, ``fcuda``, ``bcuda``), the C++ path (``native``), the ``sink`` and
the ``resolver`` (trace_rows.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..torch_import import torch_ready
from .saved_bytes import SV_N
from .trace_columns import BUFFER_ROWS, BW_CUDA, BW_GSEQ, BW_N, FW_CUDA, FW_N, PASS_END

TABLE = "python.torch_trace"
#: The writer resolves the buffers when a read waits, or at RESOLVE_ROWS forward records, or
#: RESOLVE_EVENTS backward events of the C++ path (one per named node and pass end: ~1 per
#: module call; half its buffer), or RESOLVE_S after the last resolve. A resolve costs ~30 ms
#: of writer CPU whatever its size: at a ~240 ms step every 10 s made that 1.4 ms per traced
#: step, more than the C++ path costs the training thread; reads are exact either way.
RESOLVE_ROWS = 20_000
RESOLVE_EVENTS = 100_000
RESOLVE_S = 30.0


class WriterSide:
    """Mixed into ``TorchTracer``; see the module docstring."""

    fw: Any
    bw: Any
    objs: list[Any]
    roots: list[Any]
    fcuda: list[Any]
    bcuda: list[Any]
    native: Any
    saved: Any  # SavedBytes (saved_bytes.py)
    sink: Any
    resolver: Any
    dropped: int
    armed: bool
    _stopped: bool
    _watcher: Any
    _flush_lock: threading.Lock
    _resolved_at: float
    _on_torch_imported: Callable[[], None]  # tracer.py
    recycle: Callable[[list[Any]], None]  # trace_cuda.py

    def flush(self) -> None:
        """Resolve the buffered records into the store now. The writer thread calls ``tick``
        every PROBE_FLUSH_MS and before every read; tests and ``stop()`` call this directly."""
        if not self.armed and not self._stopped and self._watcher is not None and torch_ready():
            self._on_torch_imported()  # imported by a route the watcher did not see
        with self._flush_lock:  # the resolver's state is not shared between two flushers
            self._resolved_at = time.monotonic()
            self._flush()

    def tick(self) -> None:
        """The writer's pass: resolve only when a read waits, when RESOLVE_ROWS records or
        RESOLVE_EVENTS events are buffered, or RESOLVE_S after the last resolve (batching: a
        resolve costs ~30 ms of mostly GIL-free DuckDB time whatever its size)."""
        records, events = len(self.fw) // FW_N, 0
        if self.native is not None:
            _, _, _, n_fw, events = self.native.state()
            records += n_fw
        events = max(events, len(self.saved.buf) // SV_N)  # saved-tensor records
        if self.sink is None:
            return
        if (self.sink.reader_waiting(TABLE) or records >= RESOLVE_ROWS
                or events >= RESOLVE_EVENTS or time.monotonic() - self._resolved_at >= RESOLVE_S):
            self.flush()

    def _flush(self) -> None:
        # Events first, rows second: every backward event taken then refers to forward rows
        # that were recorded before it, so they are in this take (or an earlier one).
        # Backward spans end at the next event: only take events up to the last pass end.
        n = len(self.bw) // BW_N
        gseqs = self.bw[BW_GSEQ:n * BW_N:BW_N]
        gseqs.reverse()
        cut = n - gseqs.index(PASS_END) if PASS_END in gseqs else 0
        if cut == 0 and n > BUFFER_ROWS // 2:
            cut = n  # a backward that never ends (or a lost callback): do not grow forever
        bw = _take(self.bw, cut * BW_N)
        bcuda = _take(self.bcuda, bw[BW_CUDA::BW_N].count(1))
        n = len(self.fw) // FW_N  # records come after their objects: the lists hold >= n
        fw = _take(self.fw, n * FW_N)
        objs, roots = _take(self.objs, n), _take(self.roots, n)
        fcuda = _take(self.fcuda, fw[FW_CUDA::FW_N].count(1))
        if self.native is not None:
            # after the Python path's: the native records come from later steps, or from the
            # same step with other kinds (optimizer rows are Python's), and carry no CUDA
            nbw, nfw, nobjs, nroots, fw_dropped, bw_dropped = self.native.take()
            bw.frombytes(nbw)
            fw.frombytes(nfw)
            objs += nobjs
            roots += nroots
            self.dropped += fw_dropped + bw_dropped
        # after the forward records: the saved tensors of every call taken are in this take
        saved = self.saved
        sv = _take(saved.buf, len(saved.buf) // SV_N * SV_N)
        sv_steps, saved.steps = saved.steps, []
        if self.resolver is None or self.sink is None:
            return  # never started: nothing was recorded
        for table in self.resolver.resolve(fw, objs, roots, fcuda, bw, bcuda, self.recycle,
                                           sv, sv_steps):
            self.sink.append(TABLE, table)


def _take(buf: Any, n: int) -> Any:
    """Remove and return the first ``n`` items of a list or array. Lock-free: ``buf[:n]`` and
    ``del buf[:n]`` are single C calls under the GIL, and the training thread only appends
    (at index >= n), each record with one ``frombytes``."""
    if n <= 0:
        return buf[:0]
    out = buf[:n]
    del buf[:n]
    return out

