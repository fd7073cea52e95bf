"""`probe trace [on|off|every N]`: show or change torch tracing; `--perfetto -o FILE` exports
the last N traced steps of every rank as one Chrome/Perfetto trace."""

from __future__ import annotations

import json

import click

from probe_protocol.bodies import TraceBody
from probe_protocol.query import QueryBody

from ..errors import ProbeCLIError, UsageProblemError
from ..export.perfetto import build_trace
from ..outcome import Outcome, finish
from ..output_files import output_file, refuse_existing
from ..render.text import format_csv, format_table, query_notes
from ..result import RankResult
from ..transport.client import ProbeClient
from ..transport.fanout import run_live_on_ranks
from ..transport.session import Session
from . import pass_session
from ._canned import run_canned
from ._window import last_option

STATE_COLUMNS = ("rank", "mode", "tracing_now", "step", "failures", "disabled", "dropped_rows",
                 "hot_path")


@click.command("trace")
@click.argument("mode", required=False, type=click.Choice(["on", "off", "every"]))
@click.argument("every", required=False, type=click.IntRange(min=1))
@click.option("--perfetto", is_flag=True,
              help="Write the last N traced steps of every rank as Chrome/Perfetto trace JSON "
                   "(open it in ui.perfetto.dev); needs -o.")
@click.option("-o", "--output", "out_path", type=click.Path(dir_okay=False), default=None,
              help="With --perfetto: the file to write.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing output file (never written through a symlink).")
@last_option(3, 1, "With --perfetto: how many of the last traced steps to export.")
@pass_session
def command(session: Session, mode: str | None, every: int | None, perfetto: bool,
            out_path: str | None, overwrite: bool, last: int) -> Outcome:
    """Show the torch tracing mode of every rank, or change it: `on` (every module, every
    step), `off`, or `every N` (every module on every Nth step). A change takes effect at each
    rank's next optimizer step, so no step is half traced.
    """
    if perfetto:
        if mode is not None:
            raise UsageProblemError("--perfetto exports; it takes no mode")
        if not out_path:
            raise UsageProblemError("--perfetto writes a file", help_text="add -o trace.json")
        refuse_existing(out_path, overwrite)
        return _export(session, out_path, last, overwrite)
    if mode == "every" and every is None:
        raise UsageProblemError("`every` needs N", help_text="e.g. probe trace every 10")
    if mode != "every" and every is not None:
        raise UsageProblemError(f"`{mode or 'trace'}` takes no number; did you mean every {every}?")
    if mode is None:
        results = run_live_on_ranks(session, ProbeClient.trace)
    else:
        wanted = f"every:{every}" if mode == "every" else mode
        results = run_live_on_ranks(session, ProbeClient.set_trace, wanted)
    return finish(session, results, lambda ok: _render_state(session, ok))


def _render_state(session: Session, ok: list[RankResult]) -> list[str]:
    rows = [[_cell(r, c) for c in STATE_COLUMNS] for r in ok]
    if session.output == "csv":
        return format_csv(STATE_COLUMNS, rows)
    return format_table(STATE_COLUMNS, rows, colour=session.colour)


def _cell(r: RankResult, column: str) -> object:
    if column == "rank":
        return r.rank
    body = TraceBody.from_wire(r.data)
    if column == "hot_path" and body.hot_path != "native" and body.native_build:
        return body.native_build  # why not native: building, no compiler, build failed...
    return getattr(body, column)


def _export(session: Session, path: str, last: int, overwrite: bool) -> Outcome:
    results = run_canned(session, "trace_timeline", last=last)
    ok = [r for r in results if r.ok]
    out = finish(session, results, lambda _: [], as_json=False)
    out.stderr[:0] = query_notes(ok)
    if not ok:
        return out
    columns = list(QueryBody.from_wire(ok[0].data).columns)
    rows = [row for r in ok for row in QueryBody.from_wire(r.data).rows]
    if not rows:
        out.stderr.insert(0, "probe: no traced steps yet; `probe trace on` traces every step")
        return out
    trace = build_trace(columns, rows)
    try:
        with output_file(path, overwrite=overwrite) as f:
            json.dump(trace, f)
    except OSError as e:
        raise ProbeCLIError(f"cannot write {path}: {e.strerror or e}") from e
    n_steps = len({(row[columns.index("rank")], row[columns.index("step")]) for row in rows})
    out.stderr.insert(0, f"wrote {len(rows)} spans ({n_steps} rank-steps) to {path}; open it in "
                         "https://ui.perfetto.dev")
    return out
