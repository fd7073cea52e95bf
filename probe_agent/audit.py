"""The audit log (``python.audit``): who asked this rank to do what, and what became of it.

Every /v1/eval, every step-boundary action as it moves on (queued, refused, ok...), every
profile window and flame session, and every request the access rule refused, one row each
(sql/schema.sql says what each kind writes). A /v1/eval also writes its row to
``python.evals``, which holds evals only, so that "what did I just run?" is one small table.

Rows are queued on the store (never waited for); a read of either table inserts what is queued
for it first (the store's flush on read), so a row is visible to the very next query.
"""

from __future__ import annotations

import time
from typing import Any

from .collectors import Sink

AUDIT = "python.audit"
EVALS = "python.evals"


class AuditLog:
    """Writes audit rows of one rank.

    Args:
        sink: the store.
        rank: stamped on every row; the agent updates it when the process group renumbers it.
    """

    def __init__(self, sink: Sink, rank: int) -> None:
        self.sink = sink
        self.rank = rank

    def record(self, client: str, code: str, outcome: str, error: str | None, ms: float, *,
               kind: str | None = None, action_id: str | None = None,
               at_step: int | None = None, requested_by: str | None = None) -> None:
        """One row of python.audit; of python.evals too when ``kind`` is 'eval' (the default:
        a /v1/eval request)."""
        kind = kind or "eval"
        row: dict[str, Any] = {
            "timestamp": time.time(), "rank": self.rank, "kind": kind, "client": client,
            "requested_by": requested_by, "code": code, "outcome": outcome, "error": error,
            "elapsed_ms": ms, "action_id": action_id, "at_step": at_step,
        }
        self._append(AUDIT, row)
        if kind == "eval":
            self._append(EVALS, row)

    def _append(self, table: str, row: dict[str, Any]) -> None:
        import pyarrow as pa  # lazy: loaded with the store already; off `import probe_agent`

        # Every column of the table, typed: batches are concatenated before insert.
        schema = self.sink.arrow_schema(table)
        self.sink.append(table, pa.table({f.name: [row[f.name]] for f in schema},
                                         schema=schema))
