"""ReadOnlyCheck: a client's SQL must be exactly one read statement.

DuckDB still allows CREATE/DROP after ``lock_configuration``, so statements are allow-listed by
the type DuckDB's own parser gives them (``extract_statements``), never by matching text.
"""

from __future__ import annotations

import threading

import duckdb

from .errors import QueryError

#: Statement types a client may run. DESCRIBE, SHOW, SUMMARIZE, VALUES and FROM-first queries
#: all parse as SELECT. EXPLAIN is allowed only around a SELECT (EXPLAIN ANALYZE executes).
READ_STATEMENT_TYPES = ("SELECT", "EXPLAIN")
#: Statements already found allowed; dashboards and the CLI repeat the same few (a parse is
#: ~0.2 ms of CPU in the training process).
_CACHE_SIZE = 512


class ReadOnlyCheck:
    """``check(sql)`` raises QueryError unless ``sql`` is one allowed read statement.

    Args:
        root: the connection whose parser classifies statements (no SQL runs on it).
        lock: held around the parser call (the root connection is shared).
    """

    def __init__(self, root: duckdb.DuckDBPyConnection, lock: threading.Lock) -> None:
        self._root = root
        self._lock = lock
        self._allowed: dict[str, None] = {}

    def __call__(self, sql: str) -> None:
        if sql in self._allowed:
            return
        with self._lock:
            try:
                statements = self._root.extract_statements(sql)
            except duckdb.Error as e:
                raise QueryError(one_line(e)) from None
        if len(statements) != 1:
            raise QueryError(
                f"send exactly one statement (got {len(statements)}); "
                "run several queries as separate requests"
            )
        kind = statements[0].type.name
        if kind == "EXPLAIN":
            if "ANALY" in sql.upper():  # ANALYZE/ANALYSE, wherever comments put it
                raise QueryError("EXPLAIN ANALYZE executes its statement; use plain EXPLAIN")
        elif kind not in READ_STATEMENT_TYPES:
            raise QueryError(
                f"{kind} statements are not allowed: the agent's tables are read-only. "
                f"Allowed: {', '.join(READ_STATEMENT_TYPES)} (incl. DESCRIBE, SHOW, SUMMARIZE)"
            )
        if len(self._allowed) >= _CACHE_SIZE:
            self._allowed.clear()
        self._allowed[sql] = None


def one_line(e: Exception) -> str:
    """DuckDB's message up to the query excerpt or an embedded traceback, on one line."""
    kept = []
    for line in str(e).splitlines():
        if not line.strip() or line.startswith(("LINE ", "Traceback")):
            break
        kept.append(line.strip())
    return " ".join(kept) or type(e).__name__
