"""ReadOnlyCheck: a client's SQL must be exactly one read statement, of bounded size.

DuckDB still allows CREATE/DROP after ``lock_configuration``, so statements are allow-listed by
the type DuckDB's own parser gives them, never by matching text.

Bounded work: ``extract_statements`` parses holding the GIL, so a 10 MB
``SELECT 1+1+…`` froze the training thread for 23 s and a 1M-item ``IN`` list for 7.9 s. So:

- the text is capped (PROBE_MAX_SQL_BYTES, 64 KiB) before anything parses it;
- the parse that classifies it runs as a query, ``json_serialize_sql($1)``, on the reader's own
  cursor, under the query deadline: DuckDB releases the GIL while a query executes (a 64 KiB
  ``IN`` list: 0.2 s of parsing, the longest GIL hold 12 ms, against 0.16 s held);
- ``json_serialize_sql`` serialises SELECT-type statements only (DESCRIBE, SHOW, SUMMARIZE,
  VALUES and FROM-first among them). Anything else (EXPLAIN, or a statement we refuse) goes to
  ``extract_statements`` for its type, but only up to ``_GIL_PARSE_MAX`` bytes (≤ 30 ms held).
"""

from __future__ import annotations

import threading

import duckdb

from ..errors import QueryError, TooLargeError

#: Statement types a client may run. DESCRIBE, SHOW, SUMMARIZE, VALUES and FROM-first queries
#: all parse as SELECT. EXPLAIN is allowed only around a SELECT (EXPLAIN ANALYZE executes).
READ_STATEMENT_TYPES = ("SELECT", "EXPLAIN")
#: Statements already found allowed; dashboards and the CLI repeat the same few (a parse is
#: ~0.2 ms of CPU in the training process).
_CACHE_SIZE = 512
#: Longest text classified by ``extract_statements`` (under the GIL): 8 KiB of the worst input
#: measured (nested parentheses) holds it ~26 ms.
_GIL_PARSE_MAX = 8 << 10
#: One row: error?, error type, error message, statement count. Computed in DuckDB, so that a
#: large parse tree never becomes a Python string.
_CLASSIFY = (
    "SELECT j->>'error' = 'true', j->>'error_type', j->>'error_message', "
    "json_array_length(j->'statements') FROM (SELECT json_serialize_sql($1::VARCHAR)::JSON AS j)"
)


def check_sql_text(sql: str, cap: int) -> None:
    """Refuse SQL over ``cap`` bytes of UTF-8 (TooLargeError) or holding a lone surrogate
    (QueryError), before any parser sees it."""
    if len(sql) > cap:  # characters ≤ bytes: no need to encode a huge text to refuse it
        raise too_large("SQL text", len(sql), cap, "PROBE_MAX_SQL_BYTES", "characters")
    try:
        size = len(sql.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise QueryError(bad_text("sql", e)) from None
    if size > cap:
        raise too_large("SQL text", size, cap, "PROBE_MAX_SQL_BYTES")


def too_large(what: str, size: int, cap: int, var: str, unit: str = "bytes") -> TooLargeError:
    return TooLargeError(
        f"the {what} is {size} {unit}, over the {cap}-byte limit ({var}); send less, or "
        f"raise {var} in the training job's environment")


def bad_text(field: str, e: UnicodeEncodeError) -> str:
    bad = e.object[e.start:e.end].encode("unicode_escape").decode()
    return (f"'{field}' holds a lone surrogate ({bad}) at character {e.start}, which is not "
            "text; send valid UTF-8")


class ReadOnlyCheck:
    """``check(sql, cursor)`` raises QueryError unless ``sql`` is one allowed read statement.

    Args:
        root: the connection whose parser classifies what ``json_serialize_sql`` cannot.
        lock: held around that parser call (the root connection is shared).
    """

    def __init__(self, root: duckdb.DuckDBPyConnection, lock: threading.Lock) -> None:
        self._root = root
        self._lock = lock
        self._allowed: dict[str, None] = {}

    def __call__(self, sql: str, cursor: duckdb.DuckDBPyConnection) -> None:
        """Classify ``sql`` on ``cursor`` (a query: interruptible, GIL released). The caller has
        checked its size (``check_sql_text``) and armed the query deadline on ``cursor``."""
        if sql in self._allowed:
            return
        rows = cursor.execute(_CLASSIFY, [sql]).fetchall()  # all: DuckDB 2 keeps a result open
        failed, kind, message, count = rows[0] if rows else (True, "", "", None)
        if not failed:
            self._one(count or 0)
        elif kind != "not implemented":  # a parse error: DuckDB's own words, as execute gives
            raise QueryError(f"{(kind or 'parser').title()} Error: {message}")
        elif len(sql) > _GIL_PARSE_MAX:
            raise QueryError(
                f"only a SELECT-type statement (SELECT, DESCRIBE, SHOW, SUMMARIZE, VALUES) may "
                f"be longer than {_GIL_PARSE_MAX} bytes; shorten it, or run it as a SELECT")
        else:
            self._classify_small(sql)
        if len(self._allowed) >= _CACHE_SIZE:
            self._allowed.clear()
        self._allowed[sql] = None

    def _classify_small(self, sql: str) -> None:
        with self._lock:
            try:
                statements = self._root.extract_statements(sql)
            except duckdb.Error as e:
                raise QueryError(one_line(e)) from None
        self._one(len(statements))
        kind = statements[0].type.name
        if kind == "EXPLAIN":
            if "ANALY" in sql.upper():  # ANALYZE/ANALYSE, wherever comments put it
                raise QueryError("EXPLAIN ANALYZE executes its statement; use plain EXPLAIN")
        elif kind not in READ_STATEMENT_TYPES:
            raise QueryError(
                f"{kind} statements are not allowed: the agent's tables are read-only. "
                f"Allowed: {', '.join(READ_STATEMENT_TYPES)} (incl. DESCRIBE, SHOW, SUMMARIZE)"
            )

    @staticmethod
    def _one(count: int) -> None:
        if count != 1:
            raise QueryError(
                f"send exactly one statement (got {count}); "
                "run several queries as separate requests"
            )


def one_line(e: Exception) -> str:
    """DuckDB's message up to the query excerpt or an embedded traceback, on one line."""
    kept = []
    for line in str(e).splitlines():
        if not line.strip() or line.startswith(("LINE ", "Traceback")):
            break
        kept.append(line.strip())
    return " ".join(kept) or type(e).__name__
