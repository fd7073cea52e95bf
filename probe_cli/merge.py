"""Merging per-rank Arrow results on the operator's machine: one table with a ``rank`` column,
written as an Arrow IPC file or Parquet, or queried again in a local DuckDB (``--gather``).

pyarrow and duckdb are imported here, lazily, and only here: the CLI must install and run on a
laptop without them (docs/decisions/agent.md, "Starting"). A missing one is a
MissingDependencyError naming the install.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from probe_protocol.query import ArrowBody

from .errors import MissingDependencyError, ProbeCLIError
from .result import RankResult


def _pyarrow(why: str) -> Any:
    try:
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401  (registers pa.ipc)
    except ImportError:
        raise MissingDependencyError(
            f"{why} needs pyarrow, which is not installed here", help_text="pip install pyarrow"
        ) from None
    return pa


def combine(results: Sequence[RankResult], why: str = "--format arrow") -> Any:
    """The ok ranks' Arrow streams as one ``pyarrow.Table`` in rank order, with a leading
    ``rank`` column unless the query selected one.

    Args:
        results: ranks whose answer is an ``ArrowBody`` (client.query_arrow).
        why: the option that needed pyarrow, for the error when it is missing.
    """
    pa = _pyarrow(why)
    tables = []
    for r in results:
        table = pa.ipc.open_stream(ArrowBody.from_wire(r.data).arrow).read_all()
        if "rank" not in table.column_names:  # every probe table has one; a SELECT may not
            rank = pa.array([r.rank] * table.num_rows, type=pa.int64())
            table = table.add_column(0, "rank", rank)
        tables.append(table)
    if not tables:
        return pa.table({"rank": pa.array([], type=pa.int64())})
    # "permissive": a column that is all NULL on one rank (type null) and INTEGER on another
    # still concatenates.
    return pa.concat_tables(tables, promote_options="permissive")


def write_table(table: Any, sink: Any, fmt: str) -> None:
    """Write ``table`` into ``sink`` (a binary file object: output_files.output_file) as an
    Arrow IPC file (``arrow``) or Parquet (``parquet``)."""
    pa = _pyarrow(f"--format {fmt}")
    if fmt == "parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise MissingDependencyError(
                "--format parquet needs pyarrow built with Parquet support",
                help_text="pip install pyarrow (the PyPI wheels include Parquet)",
            ) from None
        pq.write_table(table, sink)
        return
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def gather(table: Any, sql: str) -> Any:
    """Run ``sql`` over ``table`` (registered as ``results``) in a fresh in-memory DuckDB and
    return the answer as a ``pyarrow.Table``."""
    try:
        import duckdb
    except ImportError:
        raise MissingDependencyError(
            "--gather needs duckdb, which is not installed here", help_text="pip install duckdb"
        ) from None
    con = duckdb.connect(":memory:")
    try:
        con.register("results", table)
        try:
            rel = con.sql(sql)
        except duckdb.Error as e:
            raise ProbeCLIError(
                f"--gather SQL failed: {e}",
                help_text="the table is `results`: every rank's rows, with a `rank` column",
            ) from None
        if rel is None:  # a statement without a result
            return _pyarrow("--gather").table({})
        to_arrow = getattr(rel, "to_arrow_table", None) or rel.arrow
        return to_arrow()
    finally:
        con.close()


def table_rows(table: Any) -> tuple[list[str], list[str], list[list[Any]]]:
    """A ``pyarrow.Table`` as (columns, types, rows) for the text/CSV/JSON renderers."""
    cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
    rows = [list(r) for r in zip(*cols, strict=True)] if cols else []
    return list(table.column_names), [str(f.type) for f in table.schema], rows
