"""Bounded results: at most PROBE_MAX_ROWS rows and PROBE_MAX_RESULT_BYTES bytes of one query
reach Python, and the JSON is encoded a chunk at a time.

Why DuckDB measures first: ``memory_limit`` bounds DuckDB, not the conversion to Python and
JSON. ``SELECT repeat('x', 400000000)`` took the training process from 430 to 1953 MB, and 60 MB
of ``chr(1)`` became a 360 MB reply (JSON escapes a control character as six bytes). So the
client's statement is wrapped, as a relation, in::

    SELECT strlen(to_json(_probe_row)) AS __probe_bytes,
           CASE WHEN __probe_bytes <= <cap> THEN COLUMNS(*) END
    FROM _probe_row

Each row's size as JSON (escapes included) is computed inside DuckDB, with the GIL released and
under the query deadline; a row larger than the whole cap comes out as NULLs and is never
converted. Rows are then taken in chunks while their running total fits; the last chunk's
exact encoded size is checked too (DuckDB's JSON and ours differ for a few types).

Wrapping keeps the client's column names (``rel.columns``; DuckDB renames duplicates inside the
wrapper) and order. A statement DuckDB cannot wrap is read unwrapped, its Arrow batches
counted by their buffer sizes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from ..jsonsafe import jsonable

SIZE_COLUMN = "__probe_bytes"
#: Rows per Arrow batch read from DuckDB's streaming result. A batch is converted whole to Arrow
#: (only the rows within the caps go on to Python), so a batch of rows just under the cap each
#: is this many times the cap in Arrow memory; DuckDB's own chunk of 2048 rows is 8x that.
_ARROW_BATCH = 256
#: Bytes converted to Python and encoded per C call (``_slices``): 16 MB in one call held the GIL
#: for ~90 ms, a step of the training loop (bench/bench_request_bounds.py, pull_4x).
_GIL_SLICE = 1 << 20


@dataclass(slots=True)
class Bounded:
    """A result cut at a cap: ``parts`` are the JSON-encoded rows, comma-separated chunks, or
    Arrow IPC stream chunks; ``limit`` names the cap that cut it (None when nothing was cut)."""

    columns: list[str]
    types: list[str]
    parts: list[bytes]
    rows: int
    nbytes: int
    limit: str | None
    elapsed_ms: float = 0.0

    @property
    def truncated(self) -> bool:
        return self.limit is not None


#: DuckDB's bind parameters: positional (``?``) as a list, or by name (``$name``) as a dict.
Params = list[Any] | dict[str, Any]


def _relation(cur: duckdb.DuckDBPyConnection, sql: str, params: Params | None,
              max_bytes: int) -> tuple[list[str], list[str], Any, bool]:
    """(columns, types, relation to read, whether it carries SIZE_COLUMN first)."""
    rel = cur.sql(sql, params=params or None)
    if rel is None:  # not a statement that returns rows (the read-only check forbids these)
        return [], [], None, False
    columns, types = list(rel.columns), [str(t) for t in rel.types]
    try:
        sized = rel.query("_probe_row", (
            f"SELECT strlen(to_json(_probe_row)) AS {SIZE_COLUMN}, "
            f"CASE WHEN {SIZE_COLUMN} <= {int(max_bytes)} THEN COLUMNS(*) END FROM _probe_row"))
    except duckdb.Error:  # a type to_json cannot take: read it unwrapped, count Arrow bytes
        return columns, types, rel, False
    return columns, types, sized, True


def _limits(max_rows: int, max_bytes: int) -> tuple[str, str]:
    return (f"PROBE_MAX_ROWS ({max_rows} rows, or the request's max_rows)",
            f"PROBE_MAX_RESULT_BYTES ({max_bytes} bytes)")


def _encode(rows: list[Any]) -> bytes:
    """Rows as the inside of a JSON array (no brackets), like Starlette's JSONResponse."""
    text = json.dumps(rows, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text[1:-1].encode("utf-8")


def json_rows(cur: duckdb.DuckDBPyConnection, sql: str, params: Params | None,
              max_rows: int, max_bytes: int) -> Bounded:
    """Run ``sql`` and take its rows as JSON, cut at ``max_rows`` rows or ``max_bytes`` bytes.
    Only the rows within both caps are converted to Python objects."""
    columns, types, rel, sized = _relation(cur, sql, params, max_bytes)
    out = Bounded(columns, types, [], 0, 0, None)
    if rel is None:
        return out
    by_rows, by_bytes = _limits(max_rows, max_bytes)
    reader = rel.to_arrow_reader(_ARROW_BATCH)
    try:
        for batch, sizes in _arrow_batches(reader, out, max_rows, max_bytes, by_rows, by_bytes,
                                           sized):
            for part in _slices(batch, sizes):
                cols = [c.to_pylist() for c in part.columns]
                rows = [[jsonable(v) for v in r] for r in zip(*cols)] if cols else []
                _append(out, rows, max_bytes, by_bytes)
    finally:
        reader.close()  # a result cut short lets go of DuckDB's rest of it now
    return out


def _slices(batch: pa.RecordBatch, sizes: list[float]) -> Any:
    """``batch`` in slices of about ``_GIL_SLICE`` bytes: each slice's conversion and encoding
    is one C call holding the GIL, and the training thread waits for the GIL between them."""
    start, acc = 0, 0.0
    for i, size in enumerate(sizes):
        acc += size or 0
        if acc >= _GIL_SLICE:
            yield batch.slice(start, i + 1 - start)
            start, acc = i + 1, 0.0
    if start < len(sizes):
        yield batch.slice(start)


def _append(out: Bounded, rows: list[list[Any]], max_bytes: int, by_bytes: str) -> None:
    """Encode ``rows`` into ``out``; if the exact encoding overshoots the cap, keep the rows
    that fit (encoded one at a time: this happens at most once per result)."""
    if not rows:
        return
    encoded = _encode(rows)
    if out.nbytes + len(encoded) + 1 > max_bytes:
        out.limit = by_bytes
        for row in rows:
            one = _encode([row])
            if out.nbytes + len(one) + 1 > max_bytes:
                return
            _add(out, one, 1)
        return
    _add(out, encoded, len(rows))


def _add(out: Bounded, encoded: bytes, n: int) -> None:
    if out.parts:
        out.parts.append(b",")
        out.nbytes += 1
    out.parts.append(encoded)
    out.nbytes += len(encoded)
    out.rows += n


def _arrow_batches(reader: Any, out: Bounded, max_rows: int, max_bytes: int, by_rows: str,
                   by_bytes: str, sized: bool = False) -> Any:
    """(batch, its rows' sizes) of ``reader`` within the caps (SIZE_COLUMN dropped when
    ``sized``: then a row's size is its JSON size from DuckDB, else its share of the batch's
    Arrow buffers). Sets ``out.limit`` when it cuts."""
    rows = 0
    nbytes = 0.0
    for batch in reader:
        if sized:
            sizes = batch.column(0).to_pylist()
            batch = pa.RecordBatch.from_arrays(batch.columns[1:], names=batch.schema.names[1:])
        else:
            sizes = [batch.nbytes / max(1, batch.num_rows)] * batch.num_rows
        keep = 0
        for size in sizes:
            if rows + keep >= max_rows:
                out.limit = by_rows
                break
            if nbytes + (size or 0) > max_bytes:
                out.limit = by_bytes
                break
            nbytes += size or 0
            keep += 1
        rows += keep
        if keep:
            yield batch.slice(0, keep), sizes[:keep]
        if out.limit is not None:
            return


def arrow_stream(cur: duckdb.DuckDBPyConnection, sql: str, max_rows: int,
                 max_bytes: int) -> Bounded:
    """Run ``sql`` and write its rows as an Arrow IPC stream, batch by batch, within the caps.
    ``parts`` are the stream's bytes in order (each batch is serialised, then let go)."""
    columns, types, rel, sized = _relation(cur, sql, None, max_bytes)
    out = Bounded(columns, types, [], 0, 0, None)
    sink = _Chunks()
    if rel is None:
        pa.ipc.new_stream(sink, pa.schema([])).close()
        out.parts, out.nbytes = sink.parts, sink.size
        return out
    by_rows, by_bytes = _limits(max_rows, max_bytes)
    # One row past the row cap tells a cut result from one that fits exactly.
    reader = rel.to_arrow_reader(_ARROW_BATCH)
    fields = list(reader.schema)[1:] if sized else list(reader.schema)
    schema = _named(pa.schema(fields), columns)
    with reader, pa.ipc.new_stream(sink, schema) as writer:
        for batch, _ in _arrow_batches(reader, out, max_rows + 1, max_bytes, by_rows, by_bytes,
                                       sized):
            if out.rows + batch.num_rows > max_rows:
                batch = batch.slice(0, max_rows - out.rows)
                out.limit = by_rows
            writer.write_batch(pa.RecordBatch.from_arrays(batch.columns, schema=schema))
            out.rows += batch.num_rows
            if out.limit == by_rows:
                break
    out.parts, out.nbytes = sink.parts, sink.size
    return out


def _named(schema: pa.Schema, names: list[str]) -> pa.Schema:
    """``schema`` with the client's column names (the wrapper's CASE renamed them)."""
    return pa.schema([f.with_name(n) for f, n in zip(schema, names)])


class _Chunks:
    """A write-only file for ``pa.ipc.new_stream`` that keeps what it is given as a list."""

    closed = False

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def write(self, data: Any) -> int:
        b = bytes(data)
        self.parts.append(b)
        self.size += len(b)
        return len(b)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True
