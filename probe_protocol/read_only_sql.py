"""Which SQL a client may run on probe's tables: exactly one read statement.

One rule for the agent's live store (probe_agent/store/readonly.py) and the CLI's DuckDB over a
post-mortem copy (probe_cli/gather/copy_db.py), so that a copy is no easier to write through
than a live rank. DuckDB still allows CREATE/DROP after ``lock_configuration``, so statements
are allow-listed by the type DuckDB's own parser gives them, never by matching text.

Stdlib only: the caller hands in its DuckDB as two callables, ``classify`` (runs
``CLASSIFY_SQL`` with the text as its parameter and returns its one row: the parse happens as
a query, which releases the GIL and obeys a deadline) and ``kinds`` (``extract_statements``'
statement type names, for what ``json_serialize_sql`` cannot serialise; it runs holding the
GIL, so only up to ``GIL_PARSE_MAX`` bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: Statement types a client may run. DESCRIBE, SHOW, SUMMARIZE, VALUES and FROM-first queries
#: all parse as SELECT. EXPLAIN is allowed only around a SELECT (EXPLAIN ANALYZE executes).
READ_STATEMENT_TYPES = ("SELECT", "EXPLAIN")
#: Longest text classified by ``extract_statements`` (under the GIL): 8 KiB of the worst input
#: measured (nested parentheses) holds it ~26 ms.
GIL_PARSE_MAX = 8 << 10
#: One row: error?, error type, error message, statement count. Computed in DuckDB, so that a
#: large parse tree never becomes a Python string.
CLASSIFY_SQL = (
    "SELECT j->>'error' = 'true', j->>'error_type', j->>'error_message', "
    "json_array_length(j->'statements') FROM (SELECT json_serialize_sql($1::VARCHAR)::JSON AS j)"
)


class SqlRefusedError(ValueError):
    """Not one allowed read statement; ``str`` is the one-line reason."""


def check_read_only(sql: str, classify: Callable[[str], Sequence[Any] | None],
                    kinds: Callable[[str], list[str]], tables: str = "the agent's tables"
                    ) -> None:
    """Raise SqlRefusedError unless ``sql`` is one allowed read statement (module docstring).
    ``tables`` names what is read-only, in the refusal."""
    row = classify(sql)
    failed, kind, message, count = row if row else (True, "", "", None)
    if not failed:
        _one(count or 0)
        return
    if kind != "not implemented":  # a parse error: DuckDB's own words, as execute gives them
        raise SqlRefusedError(f"{(kind or 'parser').title()} Error: {message}")
    if len(sql) > GIL_PARSE_MAX:
        raise SqlRefusedError(
            f"only a SELECT-type statement (SELECT, DESCRIBE, SHOW, SUMMARIZE, VALUES) may "
            f"be longer than {GIL_PARSE_MAX} bytes; shorten it, or run it as a SELECT")
    types = kinds(sql)
    _one(len(types))
    if types[0] == "EXPLAIN":
        if "ANALY" in sql.upper():  # ANALYZE/ANALYSE, wherever comments put it
            raise SqlRefusedError("EXPLAIN ANALYZE executes its statement; use plain EXPLAIN")
    elif types[0] not in READ_STATEMENT_TYPES:
        raise SqlRefusedError(
            f"{types[0]} statements are not allowed: {tables} are read-only. "
            f"Allowed: {', '.join(READ_STATEMENT_TYPES)} (incl. DESCRIBE, SHOW, SUMMARIZE)")


def _one(count: int) -> None:
    if count != 1:
        raise SqlRefusedError(f"send exactly one statement (got {count}); "
                              "run several queries as separate requests")


def one_line(e: Exception) -> str:
    """A SQL engine's message up to its ``LINE n:`` excerpt or an embedded traceback, on one
    line: what the agent's 400s and the CLI's post-mortem queries both print."""
    kept = []
    for line in str(e).splitlines():
        if not line.strip() or line.startswith(("LINE ", "Traceback")):
            break
        kept.append(line.strip())
    return " ".join(kept) or type(e).__name__
