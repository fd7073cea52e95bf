"""Store: the sole owner of the agent's in-memory DuckDB.

Threads and ownership
---------------------
- The *root* connection is created in ``Store.__init__`` (schema applied, then the
  configuration locked). Nobody runs SQL on it; it only hands out cursors, under a lock.
- The *writer* thread (``probe-agent.writer``) owns one cursor for every write: it calls the
  registered flushers (collectors turn their in-memory buffers into Arrow there), inserts the
  queued Arrow batches, re-materialises on-demand tables and enforces byte retention. Rows are
  never inserted one at a time (≈1k rows/s); Arrow batches reach 0.5–0.9 M rows/s.
- Flush on read: every DuckDB insert costs ~1–2 ms of CPU whatever its size, and part of it
  holds the GIL the training thread needs. So the writer flushes only every PROBE_FLUSH_MS
  (default 2 s; a table with few rows waits up to 10 s) and whenever a read arrives: a query
  first asks the writer to collect and insert everything buffered so far (``sync``), so
  answers are as fresh as an eager writer's while an idle agent inserts rarely. A read waits
  only for the tables it names (``tables_named``). Housekeeping that must stay prompt
  (arming hooks) runs on ``add_ticker`` every ``_TICK_S`` and inserts nothing.
- Each reading thread has its own cursor, made on its first read. DuckDB releases the GIL while a
  query executes, so a query costs the training thread only the time to convert its result. One
  ``Deadlines`` thread calls ``cursor.interrupt()`` at ``PROBE_QUERY_TIMEOUT_MS``.

Sandbox
-------
``enable_external_access=false`` (no files, no network, no extension loading), no Python
replacement scans, bounded threads and memory, ``lock_configuration=true``. Because DuckDB still
allows CREATE/DROP after the lock, statements are allow-listed (``readonly.py``).

No spill to disk (issue 20): DuckDB's default ``temp_directory`` is ``<cwd>/.tmp``, and
``enable_external_access=false`` does not stop spilling there (a hash join over range(150M)
wrote 3.2 GiB into the training job's directory in 10 s). ``temp_directory=''`` and
``max_temp_directory_size=0`` turn it off; a query that needs more than PROBE_DB_MEMORY_MB then
fails with DuckDB's own "Out of Memory Error". DuckDB refuses to change ``temp_directory`` once
external access is off, hence the order below.

Bounded requests (issue 20): the SQL text is capped before it is parsed, and classified on the
reader's cursor under the deadline (``readonly.py``); results are cut at a row and a byte cap
inside DuckDB before they reach Python (``results.py``).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

try:
    import duckdb
    import pyarrow as pa
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("probe_agent needs the agent extra: pip install 'probe-torch[agent]'") from e

from ..config import AgentConfig
from ..errors import QueryError, QueryTimeoutError
from .catalog import load_schema
from .deadlines import Deadlines
from .readonly import ReadOnlyCheck, check_sql_text, one_line
from .results import Bounded, arrow_stream, json_rows
from .retention import enforce_retention

log = logging.getLogger(__name__)

#: Rough bytes per row per column type, for retention. Exactness does not matter: the goal is a
#: bound that holds memory flat, and DuckDB compresses below this.
_WIDTH = {"VARCHAR": 48, "BOOLEAN": 1, "INTEGER": 4, "DATE": 4, "FLOAT": 4}
_RETENTION_EVERY_S = 2.0
_SNAPSHOT_REUSE_S = 0.02
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
#: Longest a read waits for the writer to flush before it reads what is there.
_SYNC_WAIT_S = 2.0


@dataclass(frozen=True, slots=True)
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    truncated: bool
    elapsed_ms: float


class Store:
    """In-memory DuckDB with one writer thread and a cursor per reader.

    Args:
        config: supplies the sandbox limits, the query timeout, the row cap, the flush interval
            and the retention budget. The store is usable as soon as the constructor returns;
            writes queued before ``start()`` are inserted once the writer runs.
    """

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self._root = duckdb.connect(
            ":memory:",
            config={
                "temp_directory": "",  # never spill (see the module docstring)
                # DuckDB's allocator gives freed memory back to the OS only on later allocator
                # activity, unless its background threads do it: a join stopped at
                # PROBE_DB_MEMORY_MB kept 500 MB of the training process's RSS until the next
                # queries; with them it is back within 2 s (measured, issue 20).
                "allocator_background_threads": True,
                "max_temp_directory_size": "0B",
                "autoload_known_extensions": False,
                "autoinstall_known_extensions": False,
                "python_enable_replacements": False,
                "threads": config.db_threads,
                "memory_limit": f"{config.db_memory_mb}MB",
            },
        )
        self._root.execute(load_schema())
        self._root.execute("SET enable_external_access = false")
        self._root.execute("SET lock_configuration = true")
        self._root_lock = threading.Lock()
        self._writer_lock = threading.Lock()  # the writer cursor's SQL vs a stopped writer's
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._flushers: list[Callable[[], None]] = []
        self._tickers: list[Callable[[], None]] = []
        self._wake = threading.Event()
        self._waiting: list[frozenset[str] | None] = []  # tables of waiting flush() calls
        self._waiting_lock = threading.Lock()
        # Estimated rows per step-indexed table (inserts add, retention subtracts), so the
        # retention pass runs SQL only when the budget may be exceeded.
        self._rows_est: dict[str, int] = {}
        self._materializers: dict[str, Callable[[], pa.Table]] = {}
        self._materialize_lock = threading.Lock()
        self._snapshot_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._step_tables: dict[str, int] = {}
        self._last_retention = 0.0
        self.rows_written = 0
        self.rows_dropped = 0
        self._columns = self._load_columns()
        self._short_names = {t.split(".")[-1].lower(): t for t in self._columns}
        # A view (python.job_memory) is read, never written: a read naming it must flush the
        # tables its own SQL names, and retention and inserts must never see it.
        self._views = self._load_views()
        self._arrow_schemas = {
            t: self._root.sql(f"SELECT * FROM {t} LIMIT 0").to_arrow_table().schema
            for t in self._columns
        }
        self._read_only_check = ReadOnlyCheck(self._root, self._root_lock)
        self._local = threading.local()
        self._read_cursors: list[duckdb.DuckDBPyConnection] = []
        self._deadlines = Deadlines()
        # Batches taken off the queue but not inserted yet (writer thread only): a
        # read-triggered pass inserts only the tables its readers name.
        self._held: dict[str, list[Any]] = {}
        self._held_since: dict[str, float] = {}  # table -> when its oldest held batch came

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="probe-agent.writer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._deadlines.stop()
        with self._root_lock:
            for cur in self._read_cursors:
                cur.close()
            self._read_cursors.clear()
            self._root.close()

    # -- writing ----------------------------------------------------------------------------
    def append(self, table: str, data: pa.Table | pa.RecordBatch) -> None:
        """Queue an Arrow batch for ``table`` (``schema.name``). Never blocks, never raises."""
        self._queue.put((table, data))

    def add_flusher(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the writer thread every PROBE_FLUSH_MS and before every read; it
        should move everything it has buffered into ``append``."""
        self._flushers.append(fn)

    def add_ticker(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the writer thread every ``_TICK_S`` (housekeeping; no appends)."""
        self._tickers.append(fn)

    def arrow_schema(self, table: str) -> pa.Schema:
        """``table``'s columns as an Arrow schema. Build batches with it: pyarrow infers an
        untyped Python list's type by trying ``import dateutil`` first, which where dateutil is
        not installed is a failed import, a sys.path scan, 70 us per column (4 us typed)."""
        return self._arrow_schemas[table]

    def add_materializer(self, table: str, fn: Callable[[], pa.Table]) -> None:
        """Replace ``table``'s rows with ``fn()`` before any query that names it."""
        self._materializers[table] = fn

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

    def _read_cursor(self) -> duckdb.DuckDBPyConnection:
        """This thread's read cursor, made once (a cursor and its search_path cost ~0.5 ms of
        CPU; reads run on the agent's few pool threads, so there are few)."""
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            cur = self._local.cursor = self._cursor()
            with self._root_lock:
                self._read_cursors.append(cur)
        return cur

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._root_lock:
            cur = self._root.cursor()
        cur.execute("SET search_path = 'python,main'")
        return cur

    def _run(self) -> None:
        cur = self._cursor()
        interval = self.config.flush_ms / 1000.0
        next_flush = time.monotonic() + interval
        last = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            woken = self._wake.wait(max(0.0, min(_TICK_S, next_flush - now)))
            self._wake.clear()
            self._call(self._tickers)
            timed = time.monotonic() >= next_flush
            full = (self._queue.qsize() > _MAX_HELD
                    or len(self._held) and sum(map(len, self._held.values())) > _MAX_HELD)
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

    def _call(self, fns: list[Callable[[], None]]) -> None:
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
            self._insert_arrow(cur, table, tbl)
            self.rows_written += tbl.num_rows
            if table in self._step_tables:
                self._rows_est[table] = self._rows_est.get(table, 0) + tbl.num_rows
        except Exception:  # a malformed batch is a collector bug; drop it, keep the writer
            log.exception("probe agent: could not insert a batch into %s", table)

    def _insert_arrow(self, cur: duckdb.DuckDBPyConnection, table: str, tbl: pa.Table) -> None:
        schema = self._arrow_schemas.get(table)
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

    def _load_columns(self) -> dict[str, list[tuple[str, str]]]:
        rows = self._root.execute(
            "SELECT schema_name || '.' || table_name, column_name, data_type "
            "FROM duckdb_columns() c WHERE NOT internal AND EXISTS (SELECT 1 FROM duckdb_tables() t "
            "WHERE t.schema_name = c.schema_name AND t.table_name = c.table_name) "
            "ORDER BY column_index"
        ).fetchall()
        out: dict[str, list[tuple[str, str]]] = {}
        for table, col, dtype in rows:
            out.setdefault(table, []).append((col, dtype))
        for table, cols in out.items():
            if any(c == "step" for c, _ in cols):
                self._step_tables[table] = sum(_WIDTH.get(t, 8) for _, t in cols)
        return out

    def _load_views(self) -> dict[str, frozenset[str]]:
        """short view name -> the tables its SQL names."""
        rows = self._root.execute(
            "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal").fetchall()
        return {name.lower(): self._named_in(sql) for name, sql in rows}

    def _named_in(self, sql: str) -> frozenset[str]:
        lowered = sql.lower()
        return frozenset(t for short, t in self._short_names.items() if short in lowered)

    def _enforce_retention(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Drop the oldest steps until the step-indexed tables fit PROBE_RETENTION_MB."""
        try:
            self.rows_dropped += enforce_retention(
                cur, self.config.retention_mb * 1024 * 1024, self._step_tables, self._rows_est)
        except Exception:  # retention must never kill the writer
            log.exception("probe agent: retention pass failed")

    # -- reading ----------------------------------------------------------------------------
    def check_read_only(self, sql: str) -> None:
        """Raise QueryError unless ``sql`` is one allowed read statement within
        PROBE_MAX_SQL_BYTES (TooLargeError over it). Parses on this thread's read cursor, under
        the query deadline."""
        check_sql_text(sql, self.config.max_sql_bytes)
        cur = self._read_cursor()
        self._guarded(cur, lambda: self._read_only_check(sql, cur))

    def _under_deadline(self, cur: duckdb.DuckDBPyConnection, fn: Callable[[], Any]) -> Any:
        """``fn()`` with ``cur`` interrupted at PROBE_QUERY_TIMEOUT_MS."""
        deadline = self._deadlines.arm(self.config.query_timeout_ms / 1000.0, cur.interrupt)
        try:
            return fn()
        finally:
            self._deadlines.disarm(deadline)

    def _guarded(self, cur: duckdb.DuckDBPyConnection, fn: Callable[[], Any]) -> Any:
        """``_under_deadline``, with DuckDB's errors as QueryError (QueryTimeoutError when
        interrupted)."""
        try:
            return self._under_deadline(cur, fn)
        except duckdb.Error as e:
            error = self._query_error(e)
        raise error

    def _query_error(self, e: duckdb.Error) -> QueryError:
        if isinstance(e, duckdb.InterruptException):
            return QueryTimeoutError(
                f"query stopped after {self.config.query_timeout_ms} ms "
                "(PROBE_QUERY_TIMEOUT_MS); add a LIMIT or a WHERE on step")
        if isinstance(e, duckdb.OutOfMemoryException):
            return QueryError(
                f"{one_line(e)} (the agent never spills to disk: add a WHERE or a LIMIT, or "
                "raise PROBE_DB_MEMORY_MB)")
        return QueryError(one_line(e))

    def _materialize(self, cur: duckdb.DuckDBPyConnection, tables: frozenset[str]) -> None:
        for table, fn in self._materializers.items():
            if table not in tables:
                continue
            # One refresher at a time (two concurrent DELETEs conflict in DuckDB's MVCC), and
            # queries arriving within _SNAPSHOT_REUSE_S of a refresh share that snapshot.
            with self._materialize_lock:
                if time.monotonic() - self._snapshot_at.get(table, -1e9) < _SNAPSHOT_REUSE_S:
                    continue
                snapshot = fn()
                cur.execute("BEGIN")
                try:
                    cur.execute(f"DELETE FROM {table}")
                    self._insert_arrow(cur, table, snapshot)
                    cur.execute("COMMIT")
                except BaseException:
                    cur.execute("ROLLBACK")
                    raise
                self._snapshot_at[table] = time.monotonic()

    def tables_named(self, sql: str) -> frozenset[str]:
        """The agent tables ``sql`` may read (qualified): every table whose name appears in
        the text. A superset on purpose (a column or string that spells a table name costs
        one extra INSERT or refresh), so that no form of reading a table (a subquery, a CTE,
        ``query_table('steps')``) sees it stale; a parser's table list misses the last."""
        lowered = sql.lower()
        views = [tables for view, tables in self._views.items() if view in lowered]
        return self._named_in(sql).union(*views)

    def _run_read(self, sql: str, params: list[Any] | None, max_rows: int, consume: Callable):
        self.check_read_only(sql)
        named = self.tables_named(sql)
        # Flush on read (see the docstring). A materialised table (python.backtrace) is rebuilt
        # below, never appended to; `SELECT 1` or a system view needs no flush at all.
        appended = frozenset(t for t in named if t not in self._materializers)
        if appended:
            self.flush(_SYNC_WAIT_S, appended)
        cur = self._read_cursor()
        t0 = time.perf_counter()
        try:
            self._materialize(cur, named)
        except duckdb.Error as e:
            raise QueryError(one_line(e)) from None
        return self._guarded(cur, lambda: consume(cur, sql, params or [], max_rows, t0))

    def query(
        self, sql: str, params: list[Any] | None = None, max_rows: int | None = None
    ) -> QueryResult:
        """Run one read statement; at most ``max_rows`` (≤ PROBE_MAX_ROWS) rows and
        PROBE_MAX_RESULT_BYTES bytes come back, as JSON-safe Python values."""
        res = self.query_json(sql, params, max_rows)
        rows = json.loads(b"[" + b"".join(res.parts) + b"]")
        return QueryResult(res.columns, res.types, rows, res.truncated, res.elapsed_ms)

    def query_json(
        self, sql: str, params: list[Any] | None = None, max_rows: int | None = None
    ) -> Bounded:
        """Like ``query``, but the rows stay encoded: ``parts`` joined are the inside of the
        JSON ``rows`` array (what the HTTP route sends without decoding)."""
        cap = min(max_rows or self.config.max_rows, self.config.max_rows)

        def consume(
            cur: duckdb.DuckDBPyConnection, sql: str, params: list[Any], cap: int, t0: float
        ) -> Bounded:
            res = json_rows(cur, sql, params, cap, self.config.max_result_bytes)
            res.elapsed_ms = (time.perf_counter() - t0) * 1e3
            return res

        return self._run_read(sql, params, cap, consume)

    def query_arrow(self, sql: str, max_rows: int | None = None) -> Bounded:
        """Like ``query_json`` but ``parts`` joined are an Arrow IPC stream."""
        cap = min(max_rows or self.config.max_rows, self.config.max_rows)

        def consume(
            cur: duckdb.DuckDBPyConnection, sql: str, params: list[Any], cap: int, t0: float
        ) -> Bounded:
            res = arrow_stream(cur, sql, cap, self.config.max_result_bytes)
            res.elapsed_ms = (time.perf_counter() - t0) * 1e3
            return res

        return self._run_read(sql, None, cap, consume)
