"""The agent's JSON wire format (docs/http-api.md): every body the agent and its watchdog
send is built here, so that the envelope has one definition.

- Every body carries ``ok`` and ``rank``.
- An error body (every non-2xx answer) has exactly four required keys, ``ok`` (False),
  ``rank``, ``status`` (the HTTP status again, for clients that only see the body) and
  ``error`` (a message for a person); routes may add keys (``traceback``, ``reason``...).
- A query body is datasette's shape plus ``rank``: ``columns``, ``types``, ``rows``, then
  ``truncated`` (and ``truncated_by`` when a cap cut the rows) and ``elapsed_ms``.

Stdlib only: the watchdog (``python -I -S``) builds its bodies with it too. The CLI reads the
same bodies through probe_cli/transport/wire.py; tests/integration/test_wire_contract.py holds
both to the page.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any


def ok_body(rank: int, **fields: Any) -> dict[str, Any]:
    """A success body: ``ok``, ``rank``, then the route's own fields."""
    return {"ok": True, "rank": rank, **fields}


def error_body(rank: int, status: int, message: str, **extra: Any) -> dict[str, Any]:
    """An error body. Required keys, for every non-2xx answer:

    - ``ok``: always False;
    - ``rank``: the rank that answered (the watchdog answers for its rank);
    - ``status``: the HTTP status, repeated for clients that only see the body;
    - ``error``: what went wrong and, where there is one, what to do about it.
    """
    return {"ok": False, "rank": rank, "status": status, "error": message, **extra}


def encode(body: dict[str, Any]) -> bytes:
    """A body as the bytes on the wire (what is not JSON becomes its ``str``)."""
    return json.dumps(body, default=str).encode()


def query_body(rank: int, columns: Sequence[str], types: Sequence[str], rows: list[Any],
               truncated: bool, elapsed_ms: float, truncated_by: str | None = None
               ) -> dict[str, Any]:
    """A query answer, rows as Python values."""
    return {**_query_head(rank, columns, types), "rows": rows,
            **_query_tail(truncated, elapsed_ms, truncated_by)}


def query_parts(rank: int, columns: Sequence[str], types: Sequence[str],
                encoded_rows: Iterable[bytes], truncated: bool, elapsed_ms: float,
                truncated_by: str | None = None) -> list[bytes]:
    """The same answer as ``query_body``, around rows that arrive already encoded
    (store/results.py writes them a chunk at a time: a large result is never encoded twice).
    ``encoded_rows`` are comma-joined JSON arrays, as they go between ``[`` and ``]``."""
    head = json.dumps(_query_head(rank, columns, types), ensure_ascii=False,
                      separators=(",", ":"))[:-1] + ',"rows":['
    tail = json.dumps(_query_tail(truncated, elapsed_ms, truncated_by), separators=(",", ":"))
    return [head.encode(), *encoded_rows, b"]," + tail[1:].encode()]


def _query_head(rank: int, columns: Sequence[str], types: Sequence[str]) -> dict[str, Any]:
    return {"ok": True, "rank": rank, "columns": list(columns), "types": list(types)}


def _query_tail(truncated: bool, elapsed_ms: float, truncated_by: str | None) -> dict[str, Any]:
    tail: dict[str, Any] = {"truncated": truncated, "elapsed_ms": round(elapsed_ms, 3)}
    if truncated_by:
        tail["truncated_by"] = truncated_by
    return tail
