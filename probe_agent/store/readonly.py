"""ReadOnlyCheck: a client's SQL must be exactly one read statement, of bounded size.

The rule itself (which statement types, classified by DuckDB's parser, never by matching text)
is probe_protocol/read_only_sql.py's, shared with the CLI's reading of post-mortem copies.

Bounded work: ``extract_statements`` parses holding the GIL, so a 10 MB
``SELECT 1+1+…`` froze the training thread for 23 s and a 1M-item ``IN`` list for 7.9 s. So:

- the text is capped (PROBE_MAX_SQL_BYTES, 64 KiB) before anything parses it;
- the parse that classifies it runs as a query, ``json_serialize_sql($1)``, on the reader's own
  cursor, under the query deadline: DuckDB releases the GIL while a query executes (a 64 KiB
  ``IN`` list: 0.2 s of parsing, the longest GIL hold 12 ms, against 0.16 s held);
- ``json_serialize_sql`` serialises SELECT-type statements only (DESCRIBE, SHOW, SUMMARIZE,
  VALUES and FROM-first among them). Anything else (EXPLAIN, or a statement we refuse) goes to
  ``extract_statements`` for its type, but only up to ``GIL_PARSE_MAX`` bytes (≤ 30 ms held).
"""

from __future__ import annotations

import threading
from typing import Any

import duckdb

from probe_protocol.read_only_sql import (
    CLASSIFY_SQL,
    SqlRefusedError,
    check_read_only,
    one_line,
)

from ..errors import QueryError, TooLargeError

#: Statements already found allowed; dashboards and the CLI repeat the same few (a parse is
#: ~0.2 ms of CPU in the training process).
_CACHE_SIZE = 512


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

        def classify(text: str) -> Any:
            rows = cursor.execute(CLASSIFY_SQL, [text]).fetchall()  # all: DuckDB 2 keeps a
            return rows[0] if rows else None                        # result open otherwise

        try:
            check_read_only(sql, classify, self._kinds)
        except SqlRefusedError as e:
            raise QueryError(str(e)) from None
        if len(self._allowed) >= _CACHE_SIZE:
            self._allowed.clear()
        self._allowed[sql] = None

    def _kinds(self, sql: str) -> list[str]:
        with self._lock:
            try:
                statements = self._root.extract_statements(sql)
            except duckdb.Error as e:
                raise SqlRefusedError(one_line(e)) from None
        return [st.type.name for st in statements]

