"""The store: the agent's in-memory DuckDB and everything that decides what reaches it and what
comes back (one package per concern).

- store.py: ``Store``, the sole owner of DuckDB (one writer thread, a cursor per reader);
- readonly.py: a client's SQL must be one bounded read statement;
- results.py: results cut at PROBE_MAX_ROWS / PROBE_MAX_RESULT_BYTES, encoded a chunk at a time;
- deadlines.py: query timeouts; retention.py: what old rows are dropped;
- catalog.py: schema.sql and the canned queries (stdlib only).

Importing the package imports nothing heavy (``catalog`` stays stdlib only); ``Store`` is
loaded, with duckdb, when first named.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Store"]


def __getattr__(name: str) -> Any:
    if name == "Store":
        from .store import Store

        return Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
