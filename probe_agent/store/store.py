"""Store: the sole owner of the agent's in-memory DuckDB.

Threads and ownership
---------------------
- The *root* connection is created in ``Store.__init__`` (schema applied, then the
  configuration locked). Nobody runs SQL on it; it only hands out cursors, under a lock.
- The *writer* thread (``probe-agent.writer``, writer.py) owns one cursor for every write: it
  calls the registered flushers (collectors turn their in-memory buffers into Arrow there),
  inserts the queued Arrow batches and enforces byte retention on the step tables
  (retention.py's ``STEP_TABLES``). Rows are never inserted one at a time (≈1k rows/s); Arrow
  batches reach 0.5–0.9 M rows/s. On-demand tables are re-materialised by the reader that
  needs them.
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

No spill to disk: DuckDB's default ``temp_directory`` is ``<cwd>/.tmp``, and
``enable_external_access=false`` does not stop spilling there (a hash join over range(150M)
wrote 3.2 GiB into the training job's directory in 10 s). ``temp_directory=''`` and
``max_temp_directory_size=0`` turn it off; a query that needs more than PROBE_DB_MEMORY_MB then
fails with DuckDB's own "Out of Memory Error". DuckDB refuses to change ``temp_directory`` once
external access is off, hence the order below.

Bounded requests: the SQL text is capped before it is parsed, and classified on the
reader's cursor under the deadline (``readonly.py``); results are cut at a row and a byte cap
inside DuckDB before they reach Python (``results.py``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .arrow_import import load_pyarrow

try:
    load_pyarrow()  # before any other `import pyarrow` of the agent's: arrow_import.py says why
    import duckdb
    import pyarrow as pa
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("probe_agent needs the agent extra: pip install 'probe-torch[agent]'") from e

from .. import cpu_priority
from ..config import AgentConfig
from ..errors import QueryError, QueryTimeoutError
from .catalog import load_schema
from .deadlines import Deadlines
from .readonly import ReadOnlyCheck, check_sql_text, one_line
from .results import Bounded, Params, arrow_stream, json_rows
from .retention import step_table_widths
from .writer import Writer, insert_arrow

log = logging.getLogger(__name__)

_SNAPSHOT_REUSE_S = 0.02
#: Longest a read waits for the writer to flush before it reads what is there.
_SYNC_WAIT_S = 2.0
#: A query on a thread that yields the CPU to training is stopped after PROBE_QUERY_TIMEOUT_MS
#: of its own CPU time, or this many times that in wall time, whichever comes first.
BACKGROUND_WALL_FACTOR = 4


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
                # queries; with them it is back within 2 s (measured).
                "allocator_background_threads": True,
                "max_temp_directory_size": "0B",
                "autoload_known_extensions": False,
                "autoinstall_known_extensions": False,
                "python_enable_replacements": False,
                "threads": config.db_threads,
                # DuckDB 2 starts 8 threads for asynchronous file I/O by default; an in-memory
                # database without external access never uses them.
                "async_threads": 0,
                "memory_limit": f"{config.db_memory_limit_mb}MB",
            },
        )
        self._root.execute(load_schema())
        self._root.execute("SET enable_external_access = false")
        self._root.execute("SET lock_configuration = true")
        self._root_lock = threading.Lock()
        self._materializers: dict[str, Callable[[], pa.Table]] = {}
        self._materialize_lock = threading.Lock()
        self._snapshot_at: dict[str, float] = {}
        self._columns = self._load_columns()
        #: The tables retention trims, with their estimated bytes per row.
        self._step_tables = step_table_widths(self._columns)
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
        self._writer = Writer(self._cursor, config.flush_ms, config.retention_mb * 1024 * 1024,
                              self._step_tables, self._arrow_schemas,
                              config.db_memory_limit_mb * 1000 * 1000)  # DuckDB's MB: 10^6 bytes

    @property
    def rows_written(self) -> int:
        return self._writer.rows_written

    @property
    def rows_dropped(self) -> int:
        return self._writer.rows_dropped

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._writer.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._writer.stop(timeout)
        self._deadlines.stop()
        with self._root_lock:
            for cur in self._read_cursors:
                cur.close()
            self._read_cursors.clear()
            self._root.close()

    # -- writing: the collectors' Sink, done by the writer (writer.py) -------------------
    def append(self, table: str, data: pa.Table | pa.RecordBatch) -> None:
        """Queue an Arrow batch for ``table`` (``schema.name``). Never blocks, never raises."""
        self._writer.append(table, data)

    def add_flusher(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the writer thread every PROBE_FLUSH_MS and before every read."""
        self._writer.add_flusher(fn)

    def add_ticker(self, fn: Callable[[], object]) -> None:
        """Call ``fn`` on the writer thread now and then (housekeeping; no appends)."""
        self._writer.add_ticker(fn)

    def flush(self, timeout: float = 5.0, tables: frozenset[str] | None = None) -> None:
        """Block until what collectors buffered for ``tables`` (or all) is in DuckDB, at most
        ``timeout`` s."""
        self._writer.flush(timeout, tables)

    def reader_waiting(self, table: str) -> bool:
        """True while a read that needs ``table`` waits for the buffers."""
        return self._writer.reader_waiting(table)

    def memory_bytes(self) -> float:
        """DuckDB's memory (``duckdb_memory()``: tables, buffers), read on the calling thread's
        cursor. fetchall, not fetchone: a result left unfinished keeps the cursor's
        transaction open, and no deleted row older than it is ever freed (retention.py)."""
        rows = self._read_cursor().execute(
            "SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchall()
        return float(rows[0][0] or 0) if rows else 0.0

    # -- tables ---------------------------------------------------------------------------
    def arrow_schema(self, table: str) -> pa.Schema:
        """``table``'s columns as an Arrow schema. Build batches with it: pyarrow infers an
        untyped Python list's type by trying ``import dateutil`` first, which where dateutil is
        not installed is a failed import, a sys.path scan, 70 us per column (4 us typed)."""
        return self._arrow_schemas[table]

    def add_materializer(self, table: str, fn: Callable[[], pa.Table]) -> None:
        """Replace ``table``'s rows with ``fn()`` before any query that names it."""
        self._materializers[table] = fn

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

    def _load_columns(self) -> dict[str, list[tuple[str, str]]]:
        rows = self._root.execute(
            "SELECT schema_name || '.' || table_name, column_name, data_type "
            "FROM duckdb_columns() c WHERE NOT internal "
            "AND EXISTS (SELECT 1 FROM duckdb_tables() t "
            "WHERE t.schema_name = c.schema_name AND t.table_name = c.table_name) "
            "ORDER BY column_index"
        ).fetchall()
        out: dict[str, list[tuple[str, str]]] = {}
        for table, col, dtype in rows:
            out.setdefault(table, []).append((col, dtype))
        return out

    def _load_views(self) -> dict[str, frozenset[str]]:
        """short view name -> the tables its SQL names."""
        rows = self._root.execute(
            "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal").fetchall()
        return {name.lower(): self._named_in(sql) for name, sql in rows}

    def _named_in(self, sql: str) -> frozenset[str]:
        lowered = sql.lower()
        return frozenset(t for short, t in self._short_names.items() if short in lowered)

    # -- reading ----------------------------------------------------------------------------
    def check_read_only(self, sql: str) -> None:
        """Raise QueryError unless ``sql`` is one allowed read statement within
        PROBE_MAX_SQL_BYTES (TooLargeError over it). Parses on this thread's read cursor, under
        the query deadline."""
        check_sql_text(sql, self.config.max_sql_bytes)
        cur = self._read_cursor()
        self._guarded(cur, lambda: self._read_only_check(sql, cur))

    def _under_deadline(self, cur: duckdb.DuckDBPyConnection, fn: Callable[[], Any]) -> Any:
        """``fn()`` with ``cur`` interrupted at PROBE_QUERY_TIMEOUT_MS.

        On a thread that yields the CPU to training (cpu_priority.py) the limit is the thread's
        own CPU time, and at most BACKGROUND_WALL_FACTOR times that in wall time: a query that
        waited for the cores training kept busy is not stopped for the wait alone."""
        limit = self.config.query_timeout_ms / 1000.0
        if not cpu_priority.in_background():
            deadline = self._deadlines.arm(limit, cur.interrupt)
            try:
                return fn()
            finally:
                self._deadlines.disarm(deadline)
        with self._deadlines.on_cpu_time(limit, limit * BACKGROUND_WALL_FACTOR, cur.interrupt):
            return fn()

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
            if cpu_priority.in_background():
                return QueryTimeoutError(
                    f"query stopped after {self.config.query_timeout_ms} ms of its own CPU "
                    f"time or {BACKGROUND_WALL_FACTOR}x that in all (PROBE_QUERY_TIMEOUT_MS; "
                    "it runs on the CPU time training leaves); add a LIMIT or a WHERE on step")
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
                    insert_arrow(cur, table, snapshot, self._arrow_schemas.get(table))
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

    def _run_read(self, sql: str, params: Params | None, max_rows: int,
                  consume: Callable[..., Bounded]) -> Bounded:
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

    def tables(self) -> list[str]:
        """Every table the agent writes (qualified), views left out."""
        return sorted(self._columns)

    def export_arrow(self, table: str, after_rowid: int | None = None) -> pa.Table:
        """``table``'s rows as Arrow, with their DuckDB ``rowid`` as ``_rowid`` (appends only
        grow it), for the post-mortem copy: flushed and materialised as for a read, on the
        calling thread's cursor under PROBE_QUERY_TIMEOUT_MS, with no row or byte cap (the
        copy keeps its own budget). ``after_rowid``: only rows appended since."""
        named = frozenset({table})
        if table not in self._materializers:
            self.flush(_SYNC_WAIT_S, named)
        cur = self._read_cursor()
        self._materialize(cur, named)
        where = "" if after_rowid is None else f" WHERE rowid > {int(after_rowid)}"
        sql = f"SELECT rowid AS _rowid, * FROM {table}{where}"  # table: one of tables()
        return self._guarded(cur, lambda: cur.sql(sql).to_arrow_table())

    def query(
        self, sql: str, params: Params | None = None, max_rows: int | None = None
    ) -> QueryResult:
        """Run one read statement; at most ``max_rows`` (≤ PROBE_MAX_ROWS) rows and
        PROBE_MAX_RESULT_BYTES bytes come back, as JSON-safe Python values."""
        res = self.query_json(sql, params, max_rows)
        rows = json.loads(b"[" + b"".join(res.parts) + b"]")
        return QueryResult(res.columns, res.types, rows, res.truncated, res.elapsed_ms)

    def query_json(
        self, sql: str, params: Params | None = None, max_rows: int | None = None
    ) -> Bounded:
        """Like ``query``, but the rows stay encoded: ``parts`` joined are the inside of the
        JSON ``rows`` array (what the HTTP route sends without decoding)."""
        cap = min(max_rows or self.config.max_rows, self.config.max_rows)

        def consume(
            cur: duckdb.DuckDBPyConnection, sql: str, params: Params, cap: int, t0: float
        ) -> Bounded:
            res = json_rows(cur, sql, params, cap, self.config.max_result_bytes)
            res.elapsed_ms = (time.perf_counter() - t0) * 1e3
            return res

        return self._run_read(sql, params, cap, consume)

    def query_arrow(self, sql: str, max_rows: int | None = None) -> Bounded:
        """Like ``query_json`` but ``parts`` joined are an Arrow IPC stream."""
        cap = min(max_rows or self.config.max_rows, self.config.max_rows)

        def consume(
            cur: duckdb.DuckDBPyConnection, sql: str, params: Params, cap: int, t0: float
        ) -> Bounded:
            res = arrow_stream(cur, sql, cap, self.config.max_result_bytes)
            res.elapsed_ms = (time.perf_counter() - t0) * 1e3
            return res

        return self._run_read(sql, None, cap, consume)
