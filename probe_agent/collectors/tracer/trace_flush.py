"""The tracer's writer side: when to resolve the training thread's records into rows, and doing it.

``Writer`` runs on the agent's writer thread (the sink's flusher, ``TorchTracer.tick``) and on
whatever thread calls ``flush`` (``stop()``, tests). It owns the store it writes to (``sink``),
the ``RowResolver`` (trace_rows.py) and when it last resolved; it shares the record buffers
(records.py) and the saved-tensor records (saved_bytes.py) with the training thread, and takes
from them without a lock.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .. import Sink
from .records import Records, take_front
from .saved_bytes import SV_N, SavedBytes
from .trace_rows import RowResolver

TABLE = "python.torch_trace"
#: The writer resolves the buffers when a read waits, or at RESOLVE_ROWS forward records, or
#: RESOLVE_EVENTS backward events of the C++ path (one per named node and pass end: ~1 per
#: module call; half its buffer), or RESOLVE_S after the last resolve. A resolve costs ~30 ms
#: of writer CPU whatever its size: at a ~240 ms step every 10 s made that 1.4 ms per traced
#: step, more than the C++ path costs the training thread; reads are exact either way.
RESOLVE_ROWS = 20_000
RESOLVE_EVENTS = 100_000
RESOLVE_S = 30.0


class Writer:
    """Resolves the records into ``python.torch_trace``; see the module docstring.

    Args:
        records: the buffers the hot path and the step boundaries fill.
        saved: the saved-bytes counter, whose records are taken with the forward records.
    """

    def __init__(self, records: Records, saved: SavedBytes) -> None:
        self.records = records
        self.saved = saved
        self.sink: Sink | None = None
        self.resolver: RowResolver | None = None  # made at start, with the sink's schema
        self._lock = threading.Lock()  # the resolver's state is not shared by two flushers
        self._resolved_at = 0.0  # monotonic

    def start(self, sink: Sink, resolver: RowResolver) -> None:
        self.sink, self.resolver = sink, resolver

    def due(self, native: Any) -> bool:
        """The writer's pass resolves only when a read waits, when RESOLVE_ROWS records or
        RESOLVE_EVENTS events are buffered, or RESOLVE_S after the last resolve (batching: a
        resolve costs ~30 ms of mostly GIL-free DuckDB time whatever its size). ``native``:
        the C++ hot path while bound, whose buffers count too."""
        records, events = self.records.pending(native)
        events = max(events, len(self.saved.buf) // SV_N)  # saved-tensor records
        if self.sink is None:
            return False
        return (self.sink.reader_waiting(TABLE) or records >= RESOLVE_ROWS
                or events >= RESOLVE_EVENTS or time.monotonic() - self._resolved_at >= RESOLVE_S)

    def flush(self, native: Any) -> None:
        """Resolve every whole record buffered now into the store."""
        with self._lock:
            self._resolved_at = time.monotonic()
            take = self.records.take(native)
            # after the forward records: the saved tensors of every call taken are in this take
            saved = self.saved
            sv = take_front(saved.buf, len(saved.buf) // SV_N * SV_N)
            sv_steps, saved.steps = saved.steps, []
            if self.resolver is None or self.sink is None:
                return  # never started: nothing was recorded
            for table in self.resolver.resolve(take.fw, take.objs, take.roots, take.fcuda,
                                               take.bw, take.bcuda, self.records.recycle,
                                               sv, sv_steps):
                self.sink.append(TABLE, table)

    def close(self) -> None:
        if self.resolver is not None:
            self.resolver.close()

