"""Query bodies: ``POST /v1/query`` and ``POST /v1/queries/{name}`` (datasette's shape plus
``rank``), the Arrow answer, and the request.

A JSON answer is ``columns``, ``types``, ``rows``, then ``truncated`` (and ``truncated_by`` when
a cap cut the rows) and ``elapsed_ms``. The agent writes a large answer around rows that arrive
already encoded (``QueryBody.stream``): byte for byte the same JSON as ``to_wire``, with the
rows never encoded twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .envelope import Body, WireBody, as_int, sometimes
from .requests import Request, arg
from .routes import RANK_HEADER


@dataclass(frozen=True, slots=True)
class QueryRequest(Request):
    """What ``POST /v1/query`` takes: one read-only statement and an optional row cap."""

    sql: str = arg("str", required=True,
                   description="One read-only statement (SELECT, DESCRIBE, SHOW, EXPLAIN…)")
    max_rows: int | None = arg("int", ge=1, description="Row cap; at most PROBE_MAX_ROWS")


@dataclass(frozen=True, slots=True)
class QueryBody(WireBody):
    """A query answer. ``truncated_by`` names the cap that cut the rows (PROBE_MAX_ROWS or
    PROBE_MAX_RESULT_BYTES, with its value); sent only when one did."""

    rank: int | None
    columns: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    rows: tuple[list[Any], ...] = ()
    truncated: bool = False
    elapsed_ms: float | None = None
    truncated_by: str | None = sometimes()

    def stream(self, encoded_rows: Iterable[bytes]) -> list[bytes]:
        """This body's bytes, with ``encoded_rows`` (comma-joined JSON arrays, as they go
        between ``[`` and ``]``) in place of ``rows``."""
        wire = self.to_wire()
        head = {k: wire[k] for k in ("ok", "rank", "columns", "types")}
        tail = {k: v for k, v in wire.items() if k not in head and k != "rows"}
        start = json.dumps(head, ensure_ascii=False, separators=(",", ":"))[:-1] + ',"rows":['
        end = json.dumps(tail, separators=(",", ":"))
        return [start.encode(), *encoded_rows, b"]," + end[1:].encode()]

    def records(self) -> list[dict[str, Any]]:
        """Rows as ``{column: value}`` dicts (for the verdicts, which read by column name)."""
        return [dict(zip(self.columns, row)) for row in self.rows]

    def column(self, name: str) -> int:
        return self.columns.index(name)


@dataclass(frozen=True, slots=True)
class CannedRequest(Request):
    """What ``POST /v1/queries/{name}`` takes: values for the query's ``-- params:`` names."""

    params: dict[str, Any] = arg("object", {},
                                 description="values for the query's `-- params:` names")


#: Response headers of an Arrow answer (the body is the stream itself), besides RANK_HEADER.
TRUNCATED_HEADER = "X-Probe-Truncated"
TRUNCATED_BY_HEADER = "X-Probe-Truncated-By"


@dataclass(frozen=True, slots=True)
class ArrowBody:
    """``POST /v1/query`` with ``Accept: application/vnd.apache.arrow.stream``: the stream's
    bytes plus what the ``X-Probe-Rank`` and ``X-Probe-Truncated`` headers said."""

    rank: int | None
    truncated: bool
    arrow: bytes

    def headers(self, truncated_by: str | None = None) -> dict[str, str]:
        """The headers the agent sends with the stream."""
        out = {TRUNCATED_HEADER: str(self.truncated).lower(), RANK_HEADER: str(self.rank)}
        if truncated_by:
            out[TRUNCATED_BY_HEADER] = truncated_by
        return out

    @classmethod
    def from_headers(cls, headers: Any, arrow: bytes) -> ArrowBody:
        """Read from a response's (case-insensitive) headers and its content."""
        rank = headers.get(RANK_HEADER, "")
        return cls(rank=int(rank) if rank.lstrip("-").isdigit() else None,
                   truncated=headers.get(TRUNCATED_HEADER, "false").lower() == "true",
                   arrow=arrow)

    def to_wire(self) -> dict[str, Any]:
        """The dict fan-out keeps per rank (``--json`` drops the bytes)."""
        return {"ok": True, "rank": self.rank, "truncated": self.truncated, "arrow": self.arrow}

    @classmethod
    def from_wire(cls, body: Body | None) -> ArrowBody:
        b = body or {}
        return cls(rank=as_int(b.get("rank")), truncated=bool(b.get("truncated")),
                   arrow=b.get("arrow") or b"")
