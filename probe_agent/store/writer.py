"""The store's writer: one thread (``probe-agent.writer``) owns every write to DuckDB.

It calls the registered flushers (collectors turn their in-memory buffers into Arrow there),
inserts the queued Arrow batches, and enforces byte retention on the step tables. Reads reach it
only through ``flush(tables)``: a reader's marker on the queue, released after a flusher pass
that started after the marker was seen, so the read sees every row buffered before it asked
(store.py's docstring: flush on read). The Store builds one Writer and hands it a cursor
factory, the flush interval, the retention budget and the tables' Arrow schemas; nothing here
reads.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from .retention import enforce_retention, reclaim

log = logging.getLogger(__name__)

_RETENTION_EVERY_S = 2.0
#: Housekeeping cadence (tickers): cheap Python only, no inserts.
_TICK_S = 0.5
#: Shortest time between two read-triggered flushes (readers arriving in between share one).
_MIN_GAP_S = 0.05
#: Batches held (queued or taken but not inserted) that force a full pass before the timer.
_MAX_HELD = 64
#: The timed pass inserts a table's held batches once they reach _INSERT_ROWS rows or have been
#: held _MAX_HOLD_S. Reads insert what they name at once, so this costs no freshness; it spares
#: an agent with tracing off ~4 inserts of a few rows every PROBE_FLUSH_MS (~2 ms of CPU each,
#: much of it in duckdb's Python layer, under the GIL: 0.4% of the training thread, measured).
_INSERT_ROWS = 2048
_MAX_HOLD_S = 10.0


class Writer:
    """The writer thread and what waits for it.

    Args:
        cursor: makes a new cursor on the store's connection (search_path set).
        flush_ms: PROBE_FLUSH_MS: the timed pass's period.
        retention_bytes: PROBE_RETENTION_MB in bytes, over all step tables together.
        step_tables: the tables retention trims, with their estimated bytes per row.
        arrow_schemas: every table's columns, for the fast insert path.
        memory_limit: DuckDB's memory_limit in bytes: retention frees deleted rows' memory
            only with room to spare under it (retention.py).
    """

    def __init__(self, cursor: Callable[[], duckdb.DuckDBPyConnection], flush_ms: int,
                 retention_bytes: int, step_tables: dict[str, int],
                 arrow_schemas: dict[str, pa.Schema], memory_limit: int) -> None:
        self._cursor = cursor
        self.flush_ms = flush_ms
        self.retention_bytes = retention_bytes
        self.memory_limit = memory_limit
        self._unreclaimed = 0  # estimated bytes deleted since the last checkpoint
        self.reclaims = 0
        self._step_tables = step_tables
        self._arrow_schemas = arrow_schemas
        self._writer_lock = threading.Lock()  # the writer cursor's SQL vs a stopped writer's
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._flushers: list[Callable[[], None]] = []
        self._tickers: list[Callable[[], object]] = []
        self._wake = threading.Event()
        self._waiting: list[frozenset[str] | None] = []  # tables of waiting flush() calls
        self._waiting_lock = threading.Lock()
        # Estimated rows per step table (inserts add, retention subtracts), so the retention
        # pass runs SQL only when the budget may be exceeded.
        self._rows_est: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_retention = 0.0
        self.rows_written = 0
        self.rows_dropped = 0
        # Batches taken off the queue but not inserted yet (writer thread only): a
        # read-triggered pass inserts only the tables its readers name.
        self._held: dict[str, list[Any]] = {}
        self._held_since: dict[str, float] = {}  # table -> when its oldest held batch came

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="probe-agent.writer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop the thread after a last pass that inserts everything held."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- what collectors call (through the Store) ------------------------------------------
    def append(self, table: str, data: pa.Table | pa.RecordBatch) -> None:
        """Queue an Arrow batch for ``table`` (``schema.name``). Never blocks, never raises."""
        self._queue.put((table, data))

    def add_flusher(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the writer thread every PROBE_FLUSH_MS and before every read; it
        should move everything it has buffered into ``append``."""
        self._flushers.append(fn)

    def add_ticker(self, fn: Callable[[], object]) -> None:
        """Call ``fn`` on the writer thread every ``_TICK_S`` (housekeeping; no appends)."""
        self._tickers.append(fn)

    def flush(self, timeout: float = 5.0, tables: frozenset[str] | None = None) -> None:
        """Collect every collector's buffers and block until they are in DuckDB (reads, tests,
        shutdown): those of ``tables`` (qualified names), or all. Gives up after ``timeout`` s:
        a read then sees what is already there."""
        done = threading.Event()
        with self._waiting_lock:
            self._waiting.append(tables)
        try:
            self._flush_now(done, timeout, tables)
        finally:
            with self._waiting_lock:
                self._waiting.remove(tables)

    def reader_waiting(self, table: str) -> bool:
        """True while a read (or test, or shutdown) that needs ``table`` waits for the
        buffers: a collector that batches its work over several passes (the tracer) does it
        now, and only for the reads that name its table."""
        with self._waiting_lock:
            return any(t is None or table in t for t in self._waiting)

    # -- the writer thread ------------------------------------------------------------------
    def _flush_now(self, done: threading.Event, timeout: float,
                   tables: frozenset[str] | None) -> None:
        self._queue.put(("", (done, tables)))
        if self._thread is None or not self._thread.is_alive():
            cur = self._cursor()
            try:
                with self._writer_lock:
                    self._collect(cur)
            finally:
                cur.close()
        else:
            self._wake.set()
            done.wait(timeout)

    def _run(self) -> None:
        cur = self._cursor()
        interval = self.flush_ms / 1000.0
        next_flush = time.monotonic() + interval
        last = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            woken = self._wake.wait(max(0.0, min(_TICK_S, next_flush - now)))
            self._wake.clear()
            self._call(self._tickers)
            timed = time.monotonic() >= next_flush
            full = (self._queue.qsize() > _MAX_HELD
                    or bool(self._held) and sum(map(len, self._held.values())) > _MAX_HELD)
            if woken or timed or full:
                # Many clients reading at once share passes: at most one per _MIN_GAP_S, so
                # a busy dashboard costs the writer 20 passes a second, not one per query.
                gap = _MIN_GAP_S - (time.monotonic() - last)
                if woken and not (timed or full) and gap > 0:
                    self._stop.wait(gap)
                with self._writer_lock:
                    self._collect(cur, everything=full, timed=timed)
                last = time.monotonic()
                if timed or full:
                    next_flush = last + interval
        with self._writer_lock:
            self._collect(cur, everything=True)
        cur.close()

    def _call(self, fns: Sequence[Callable[[], object]]) -> None:
        for fn in list(fns):
            try:
                fn()
            except Exception:  # a collector bug must not stop the writer; it logs itself
                log.exception("probe agent: %r failed on the writer thread", fn)

    def _collect(self, cur: duckdb.DuckDBPyConnection, everything: bool = True,
                 timed: bool = False) -> None:
        """Run the flushers, insert what the readers need (or everything; or, on the timed
        pass, the tables that are due), then release the readers.

        A read's marker may arrive while the flushers run; it is released only after a
        flusher pass that started after it was seen, so the read sees every row buffered
        before it asked. A read-triggered pass inserts only the tables its readers name (an
        INSERT costs ~1 ms of CPU whatever its size, and 50 clients reading backtraces must not
        insert every table 20 times a second); the rest stays held until the timed pass finds
        it due (_INSERT_ROWS, _MAX_HOLD_S).
        """
        self._call(self._flushers)
        events, wanted = self._take()
        if events:
            self._call(self._flushers)
            more, more_wanted = self._take()
            events += more
            wanted = None if wanted is None or more_wanted is None else wanted | more_wanted
        now = time.monotonic()
        for table in list(self._held):
            if (everything or wanted is None or table in wanted or timed and (
                    now - self._held_since.get(table, now) >= _MAX_HOLD_S
                    or sum(b.num_rows for b in self._held[table]) >= _INSERT_ROWS)):
                self._held_since.pop(table, None)
                self._insert(cur, table, self._held.pop(table))
        if time.monotonic() - self._last_retention > _RETENTION_EVERY_S:
            self._last_retention = time.monotonic()
            self._enforce_retention(cur)
        for ev in events:
            ev.set()

    def _take(self) -> tuple[list[threading.Event], frozenset[str] | None]:
        """Move every queued batch into ``_held``; return the readers' markers and the tables
        they need (None: every table)."""
        events: list[threading.Event] = []
        wanted: frozenset[str] | None = frozenset()
        try:
            while True:
                table, data = self._queue.get_nowait()
                if isinstance(data, tuple):  # a reader's marker: (event, tables or None)
                    events.append(data[0])
                    wanted = None if wanted is None or data[1] is None else wanted | data[1]
                elif table:
                    self._held.setdefault(table, []).append(data)
                    self._held_since.setdefault(table, time.monotonic())
        except queue.Empty:
            pass
        return events, wanted

    def _insert(self, cur: duckdb.DuckDBPyConnection, table: str, batches: list[Any]) -> None:
        try:
            tbl = pa.concat_tables(
                [b if isinstance(b, pa.Table) else pa.Table.from_batches([b]) for b in batches],
                promote_options="default",
            )
            insert_arrow(cur, table, tbl, self._arrow_schemas.get(table))
            self.rows_written += tbl.num_rows
            if table in self._step_tables:
                self._rows_est[table] = self._rows_est.get(table, 0) + tbl.num_rows
        except Exception:  # a malformed batch is a collector bug; drop it, keep the writer
            log.exception("probe agent: could not insert a batch into %s", table)

    def _enforce_retention(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Drop the oldest steps until the step-indexed tables fit PROBE_RETENTION_MB; free
        the dropped rows' memory once they add up to half the budget (retention.py)."""
        try:
            rows, nbytes = enforce_retention(
                cur, self.retention_bytes, self._step_tables, self._rows_est)
            self.rows_dropped += rows
            self._unreclaimed += nbytes
            live = sum(n * self._step_tables[t] for t, n in self._rows_est.items())
            if (self._unreclaimed * 2 >= self.retention_bytes
                    and reclaim(cur, self.memory_limit, live)):
                self._unreclaimed = 0
                self.reclaims += 1
                # pyarrow's pool (mimalloc) keeps freed pages for reuse: the Arrow batches that
                # carried the rows just freed held 40 MiB of RSS at PROBE_RETENTION_MB=128.
                pa.default_memory_pool().release_unused()
        except Exception:  # retention must never kill the writer
            log.exception("probe agent: retention pass failed")


def insert_arrow(cur: duckdb.DuckDBPyConnection, table: str, tbl: pa.Table,
                 schema: pa.Schema | None) -> None:
    """Insert ``tbl`` into ``table``; columns ``tbl`` lacks get their DEFAULT."""
    if schema is not None and tbl.column_names == schema.names:
        # Every column, in the table's order: a relation insert skips register/unregister
        # (0.73 ms of CPU per insert here, against 1.23 ms).
        cur.from_arrow(tbl).insert_into(table)
        return
    cols = ", ".join(f'"{c}"' for c in tbl.column_names)  # the others get their DEFAULT
    cur.register("_probe_batch", tbl)
    try:
        cur.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _probe_batch")
    finally:
        cur.unregister("_probe_batch")
