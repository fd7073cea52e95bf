"""`probe query SQL`: one SQL statement on every rank, answers merged into one table."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import click

from probe_protocol.query import QueryBody, QueryRequest

from ..errors import EXIT_FAILURE, ProbeCLIError, UsageProblemError
from ..group import rank_label
from ..outcome import Outcome, exit_code, failure_summary, finish
from ..output_files import output_file, refuse_existing
from ..render.text import (
    csv_lines,
    format_csv,
    format_table,
    json_default,
    json_line,
    query_notes,
    render_query_table,
    truncation,
    truncation_notes,
)
from ..result import RankResult
from ..transport.client import ProbeClient
from ..transport.fanout import calling, calling_live, fan_out, resolve_ranks
from ..transport.nodetree import NodeCall, fan_out_nodes, stream_nodes
from ..transport.rank_client import RankClient
from ..transport.session import Session
from ..transport.untrusted_text import escape_body
from . import pass_session

FORMATS = ("table", "json", "csv", "arrow", "parquet")
BINARY = ("arrow", "parquet")


@dataclass(frozen=True, slots=True)
class GatheredBody:
    """``probe query --gather SQL --json``: not an agent's body but the CLI's own answer, every
    rank's rows merged and queried again locally; ``ranks`` are the ranks it came from."""

    ranks: tuple[int | None, ...]
    columns: tuple[str, ...]
    types: tuple[str, ...]
    rows: tuple[list[Any], ...]

    def to_wire(self) -> dict[str, Any]:
        return {"ok": True, "ranks": list(self.ranks), "columns": list(self.columns),
                "types": list(self.types), "rows": list(self.rows)}


def schema_tables() -> list[str]:
    """The tables and views of sql/schema.sql, in its order (``python.`` names)."""
    import re

    from ..transport.postmortem import schema_text

    try:
        text = schema_text()
    except (OSError, ProbeCLIError):
        return []
    names = re.findall(r"^CREATE (?:TABLE|VIEW) IF NOT EXISTS (python\.\w+)", text, re.M)
    return list(dict.fromkeys(names))


class _QueryCommand(click.Command):
    """`probe query --help` ends with the tables there are to query (read from schema.sql when
    help is asked for, not at every start)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        tables = schema_tables()
        if tables:
            with formatter.section("Tables (columns: `probe query \"DESCRIBE python.steps\"`)"):
                formatter.write_text(", ".join(tables))
        super().format_epilog(ctx, formatter)


@click.command("query", cls=_QueryCommand)
@click.argument("sql")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="Output format. Default: table, or json/csv when --json/--csv is given. "
                   "arrow (an Arrow IPC file) and parquet need -o FILE and pyarrow.")
@click.option("-o", "--output", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write the result to this file instead of stdout.")
@click.option("--gather", "gather_sql", metavar="SQL", default=None,
              help="Load every rank's rows (plus a `rank` column) into a local in-memory DuckDB "
                   "as table `results`, run this SQL over it and print that instead. Needs "
                   "duckdb and pyarrow on this machine.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing output file (never written through a symlink).")
@click.option("--max-rows", type=click.IntRange(min=1), default=None,
              help="Rows per rank at most; the agent's PROBE_MAX_ROWS caps it anyway.")
@pass_session
def command(
    session: Session, sql: str, fmt: str | None, out_path: str | None, gather_sql: str | None,
    max_rows: int | None, overwrite: bool,
) -> Outcome:
    """Run one read-only SQL statement on every rank.

    Several ranks answer as one table with a leading `rank` column. Tables: python.backtrace,
    python.torch_trace and the others in sql/schema.sql.
    """
    fmt = fmt or {"json": "json", "csv": "csv"}.get(session.output, "table")
    if fmt in BINARY and not out_path:
        raise UsageProblemError(
            f"--format {fmt} writes a binary file", help_text=f"add -o FILE (e.g. -o result.{fmt})"
        )
    if out_path:
        refuse_existing(out_path, overwrite)
    if gather_sql is not None or fmt in BINARY:
        out = _via_arrow(session, sql, fmt, out_path, gather_sql, max_rows, overwrite)
    else:
        # One request per node where a host runs several ranks (nodetree.py).
        node = NodeCall("query", QueryRequest(sql, max_rows).to_wire())
        targets, call = resolve_ranks(session), calling(RankClient.query, sql, max_rows)
        if fmt == "table":  # column widths need every row
            results = fan_out_nodes(session, targets, call, node)
            out = finish(session, results, lambda ok: render_query_table(ok, session.colour),
                         as_json=False)
            out.stderr[:0] = query_notes([r for r in results if r.ok])
        else:
            out = Outcome()
            out.stream = _streamed(session, stream_nodes(session, targets, call, node), fmt, out)
    if out_path and fmt not in BINARY:
        if _write_text(out_path, out.stream if out.stream is not None else out.stdout,
                       overwrite):
            out.stderr.insert(0, f"wrote {out_path}")
        out.stdout, out.stream = [], None
    return out


def _streamed(session: Session, results: Iterator[RankResult], fmt: str,
              out: Outcome) -> Iterator[str]:
    """``--json``/``--csv`` lines rank by rank as the ranks answer (main.py prints them while
    the fan-out goes on), so the CLI holds one rank's rows at a time, not the job's. The text
    is what ``finish`` prints for the whole answer; ``out``'s stderr and exit code are set once
    every rank is in.
    """
    seen: list[RankResult] = []  # every rank, a printed answer's rows dropped
    cuts: list[tuple[int | None, str]] = []
    held: str | None = None  # --json: the last body, held for its trailing comma
    columns: list[str] | None = None  # --csv: the first answer's, as with_rank_column
    for r in results:
        if fmt == "json":
            yield "[" if held is None else held + ","
            held = json_line(r)
        elif r.ok:
            q = QueryBody.from_wire(r.data)
            if columns is None:
                columns = list(q.columns)
                yield from csv_lines([columns if "rank" in columns else ["rank", *columns]])
            rows = q.rows if "rank" in columns else ([r.rank, *row] for row in q.rows)
            yield from csv_lines(rows)
        if r.ok:
            cuts += [c for c in [truncation(r)] if c is not None]
            r = replace(r, data=None)
        seen.append(r)
    if fmt == "json":
        yield "[]" if held is None else held
        if held is not None:
            yield "]"
    out.exit_code = exit_code(seen)
    out.stderr[:0] = truncation_notes(cuts) + failure_summary(seen, session.timeout,
                                                             session.target_note)


def _via_arrow(
    session: Session, sql: str, fmt: str, out_path: str | None, gather_sql: str | None,
    max_rows: int | None, overwrite: bool,
) -> Outcome:
    from .. import merge  # pyarrow/duckdb stay unimported unless this path runs

    results = fan_out(session, resolve_ranks(session),
                      calling_live(ProbeClient.query_arrow, sql, max_rows))
    ok = [r for r in results if r.ok]
    out = Outcome(exit_code=exit_code(results))
    out.stderr = query_notes(ok)
    summary = failure_summary(results, session.timeout, session.target_note)
    if not ok:
        out.stderr += summary
        return out
    why = "--gather" if gather_sql is not None else f"--format {fmt}"
    table = merge.combine(ok, why)
    if gather_sql is not None:
        table = merge.gather(table, gather_sql)
    if fmt in BINARY:
        assert out_path is not None
        try:
            with output_file(out_path, "wb", overwrite=overwrite) as f:
                merge.write_table(table, f, fmt)
        except OSError as e:
            raise ProbeCLIError(f"cannot write {out_path}: {e.strerror or e}", EXIT_FAILURE) from e
        out.stderr.append(
            f"wrote {table.num_rows} rows from {rank_label([r.rank for r in ok])} to {out_path}"
        )
    else:
        cols, types, rows = merge.table_rows(table)
        if not session.raw:  # Arrow strings skip the client's JSON decoding: escape them here
            cols, rows = escape_body(list(cols)), escape_body([list(r) for r in rows])
        if fmt == "json":
            body = GatheredBody(tuple(r.rank for r in ok), tuple(cols), tuple(types), tuple(rows))
            out.stdout = [json.dumps(body.to_wire(), ensure_ascii=False, default=json_default)]
        elif fmt == "csv":
            out.stdout = format_csv(cols, rows)
        else:
            out.stdout = format_table(cols, rows, colour=session.colour)
    out.stderr += summary
    return out


def _write_text(path: str, lines: Iterable[str], overwrite: bool) -> bool:
    """Write the lines as they come; False (and no file) when there are none."""
    it = iter(lines)
    first = next(it, None)
    if first is None:
        return False
    try:
        with output_file(path, overwrite=overwrite) as f:
            f.write(first + "\n")
            for line in it:
                f.write(line + "\n")
    except OSError as e:
        raise ProbeCLIError(f"cannot write {path}: {e.strerror or e}") from e
    return True
