"""Pure rendering: RankResults -> lines of text, tables, JSON, CSV. Stdlib only.

Nothing here prints; main.py does. Colour is decided once in main.py and passed in as
``colour``; with it False the output is plain ASCII-safe text fit for pipes. Backtraces are in
``stacks.py``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from probe_protocol.bodies import EvalBody, EvalJobBody, InfoBody
from probe_protocol.envelope import Envelope
from probe_protocol.query import QueryBody

from ..group import group_by, rank_label
from ..result import RankResult

_STYLES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
#: Longest cell shown in a human table; --json and --csv always carry the full value.
MAX_CELL = 120


def paint(text: str, style: str, colour: bool) -> str:
    """``text`` in an ANSI style (``bold``, ``red``...) when ``colour``, else unchanged."""
    if not colour or not text:
        return text
    codes = ";".join(_STYLES[s] for s in style.split())
    return f"\x1b[{codes}m{text}\x1b[0m"


def format_cell(value: Any) -> str:
    """One value as a table cell: NULL for None, no newlines, long text cut with an ellipsis."""
    if value is None:
        text = "NULL"
    elif isinstance(value, float):
        text = repr(value) if math.isfinite(value) else str(value)
    elif isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=False, default=str)
    else:
        text = str(value)
    text = text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", " ")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)


def format_table(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], *, colour: bool = False
) -> list[str]:
    """An aligned text table: header, a rule, then rows; numbers right-aligned."""
    cells = [[format_cell(v) for v in row] for row in rows]
    header = [str(c) for c in columns]
    widths = [len(h) for h in header]
    for row in cells:
        for i, c in enumerate(row[: len(widths)]):
            widths[i] = max(widths[i], len(c))
    right = [
        bool(rows) and all(_numeric(row[i]) or row[i] is None for row in rows if i < len(row))
        for i in range(len(header))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=False)
        ]
        return "  ".join(parts).rstrip()

    out = [paint(line(header), "bold", colour), "  ".join("-" * w for w in widths)]
    out.extend(line(row) for row in cells)
    return out


def rank_header(r: RankResult, colour: bool = False, extra: str = "") -> str:
    """py-spy's process header, per rank: ``Rank 1 (host:pid) http://…``."""
    who = f"Rank {r.rank if r.rank is not None else '?'}"
    env = Envelope.from_wire(r.data)
    host = r.host or env.host
    pid = r.pid or env.pid
    where = ":".join(str(x) for x in (host, pid) if x is not None)
    text = f"{paint(who, 'bold cyan', colour)}{f' ({where})' if where else ''} {r.url}"
    return f"{text} {extra}".rstrip()


def json_default(value: Any) -> Any:
    """JSON for values the wire never sends but a local DuckDB (``--gather``) returns:
    integral decimals (``sum()`` of BIGINT is HUGEINT) as ints, times as ISO text, bytes as hex
    (the agent's conventions, docs/decisions/)."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def render_json(results: Sequence[RankResult]) -> str:
    """One JSON array of the per-rank wire bodies in rank order (py-spy ``dump --json``).

    A rank that answered with an error body contributes that body; one that gave no answer
    contributes ``{"ok": false, "rank": R, "status": null, "error": "..."}``. One line per rank
    keeps big results greppable while the whole stays one JSON document.
    """
    bodies = [json_line(r) for r in results]
    return "[\n" + ",\n".join(bodies) + "\n]" if bodies else "[]"


def json_line(r: RankResult) -> str:
    """One rank's line of ``render_json`` (``probe query --json`` streams them one by one)."""
    return json.dumps(wire_body(r), ensure_ascii=False, default=json_default)


def wire_body(r: RankResult) -> dict[str, Any]:
    if r.data is not None:
        return {k: v for k, v in r.data.items() if not isinstance(v, bytes)}
    message = r.error.message if r.error is not None else "no answer"
    return {"ok": False, "rank": r.rank, "status": None, "error": message, "url": r.url}


# -- query ----------------------------------------------------------------------------------


def same_columns(results: Sequence[RankResult]) -> bool:
    cols = {QueryBody.from_wire(r.data).columns for r in results}
    return len(cols) == 1


def render_query_table(results: Sequence[RankResult], colour: bool = False) -> list[str]:
    """One rank: its table. Several with the same columns: one table with a leading ``rank``
    column. Several with different columns: a header and a table per rank."""
    if len(results) == 1:
        q = QueryBody.from_wire(results[0].data)
        return format_table(q.columns, q.rows, colour=colour)
    if same_columns(results):
        cols, rows = with_rank_column(results)
        return format_table(cols, rows, colour=colour)
    out: list[str] = []
    for r in results:
        q = QueryBody.from_wire(r.data)
        out += [rank_header(r, colour), *format_table(q.columns, q.rows, colour=colour), ""]
    return out[:-1]


def format_csv(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """CSV lines (RFC 4180 quoting); NULL is an empty field, nested values are JSON."""
    return csv_lines([columns]) + csv_lines(rows)


def csv_lines(rows: Iterable[Sequence[Any]]) -> list[str]:
    """``format_csv`` without the header: the lines of these rows alone (a streamed table)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for row in rows:
        w.writerow([_csv_value(v) for v in row])
    return buf.getvalue().splitlines()


def with_rank_column(results: Sequence[RankResult]) -> tuple[list[str], list[list[Any]]]:
    """Every rank's rows under the first rank's columns, with a leading ``rank`` column unless
    the query already selected one (every probe table carries ``rank``)."""
    bodies = [QueryBody.from_wire(r.data) for r in results]
    cols = list(bodies[0].columns) if bodies else []
    rows = [list(row) for q in bodies for row in q.rows]
    if "rank" in cols:
        return cols, rows
    ranks = [r.rank for r, q in zip(results, bodies) for _ in q.rows]
    return ["rank", *cols], [[rank, *row] for rank, row in zip(ranks, rows, strict=True)]


def render_query_csv(results: Sequence[RankResult]) -> list[str]:
    """CSV with a leading ``rank`` column (unless selected already); header from rank 0."""
    return format_csv(*with_rank_column(results))


def _csv_value(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False, default=str)
    return v


def query_notes(results: Iterable[RankResult]) -> list[str]:
    """stderr notes: ranks whose result was cut at one of the agent's caps, by cap."""
    return truncation_notes(c for r in results if (c := truncation(r)) is not None)


def truncation(r: RankResult) -> tuple[int | None, str] | None:
    """``(rank, cap)`` when this rank's query result was cut at one of the agent's caps."""
    body = QueryBody.from_wire(r.data)
    return (r.rank, body.truncated_by or "the agent's row cap") if body.truncated else None


def truncation_notes(cuts: Iterable[tuple[int | None, str]]) -> list[str]:
    by_cap: dict[str, list[int | None]] = {}
    for rank, cap in cuts:
        by_cap.setdefault(cap, []).append(rank)
    return [
        f"note: {rank_label(ranks)}: result truncated at {cap}; add a LIMIT or aggregate, or "
        f"raise {cap.split()[0] if cap.startswith('PROBE_') else 'PROBE_MAX_ROWS'} on the "
        "training side"
        for cap, ranks in by_cap.items()
    ]


# -- info -----------------------------------------------------------------------------------

INFO_COLUMNS = ("rank", "host", "pid", "python", "torch", "version", "access", "hot_path",
                "uptime")


def format_duration(seconds: Any) -> str:
    """``3725`` -> ``1h02m``; short and sortable by eye."""
    if not _numeric(seconds):
        return ""
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h:02d}h"
    if h:
        return f"{h}h{m:02d}m"
    return f"{m}m{s:02d}s" if m else f"{s}s"


def info_rows(
    results: Sequence[RankResult], *, raw: bool = False
) -> tuple[list[str], list[list[Any]]]:
    """The info table's columns and rows; ``raw`` keeps uptime as seconds (for CSV)."""
    cols = [*INFO_COLUMNS[:-1], "uptime_s" if raw else "uptime"]
    rows = []
    for r in results:
        d = r.data or {}
        info = InfoBody.from_wire(d)
        up = d.get("uptime_s")  # as sent: CSV keeps the agent's number unrounded
        rows.append([
            r.rank, info.host if "host" in d else r.host, info.pid if "pid" in d else r.pid,
            info.python, info.torch or ("" if raw else "-"), info.version,
            _access(info.access), info.hot_path or ("" if raw else "-"),
            up if raw else format_duration(up),
        ])
    return cols, rows


def _access(a: Any) -> str:
    """``same-user + token, 3 refused``: who may reach the rank."""
    if not isinstance(a, dict):
        return "-"
    text = str(a.get("mode") or "-")
    if str(a.get("tcp", "")).startswith("off"):
        text += ", no TCP"
    if a.get("refused"):
        text += f", {a['refused']} refused"
    return text


def render_info(results: Sequence[RankResult], colour: bool = False) -> list[str]:
    cols, rows = info_rows(results)
    return format_table(cols, rows, colour=colour)


# -- eval -----------------------------------------------------------------------------------


def eval_text(body: dict[str, Any] | None) -> list[str]:
    """What an eval showed: its printed output, then the repr of a trailing expression."""
    ev = EvalBody.from_wire(body)
    lines = ev.stdout.splitlines()
    if ev.result is not None:
        lines += ev.result.splitlines() or [""]
    return lines


def _eval_key(r: RankResult) -> tuple[str, str, str]:
    ev = EvalBody.from_wire(r.data)
    return (ev.stdout, str(ev.result), str(ev.traceback or ev.error))


def render_eval(results: Sequence[RankResult], colour: bool = False) -> list[str]:
    """One rank: its output as is (so ``$(probe PID eval x)`` works). Several: ranks with
    identical output grouped under ``ranks 0–6,8:``, in rank order."""
    if len(results) == 1:
        return eval_text(results[0].data)
    out: list[str] = []
    for g in group_by(results, _eval_key):
        label = rank_label([m.rank for m in g.members]) + ":"
        out += [paint(label, "bold", colour), *(eval_text(g.first.data) or ["(no output)"])]
    return out


def render_eval_failures(
    results: Sequence[RankResult], colour: bool = False, *, labels: bool = True
) -> list[str]:
    """stderr: the traceback of each group of ranks whose code raised (with what it printed
    first), under its rank label unless ``labels`` is False (a single-rank job). Ranks that
    gave no eval answer at all are left to the summary."""
    raised = [r for r in results if EvalBody.raised(r.data)]
    out: list[str] = []
    for g in group_by(raised, _eval_key):
        ev = EvalBody.from_wire(g.first.data)
        if labels:
            out.append(paint(rank_label([m.rank for m in g.members]) + ":", "bold red", colour))
        out += ev.stdout.splitlines()
        tb = ev.traceback or ev.error or ""
        out += tb.rstrip("\n").splitlines()
    return out


def render_eval_cancelled(results: Sequence[RankResult], colour: bool = False) -> list[str]:
    """``probe eval --cancel ID``: per rank, whether the eval stopped, and if it did not, what
    it costs the training steps meanwhile."""
    rows = []
    for r in results:
        ev = EvalJobBody.from_wire(r.data)
        what = ("still running (blocked in a C call; it stops when that returns)"
                if ev.still_running else ev.eval.get("state"))
        rows.append([r.rank, ev.eval.get("id"), what, describe_step_cost(ev.cost)])
    return format_table(["rank", "eval", "state", "step time while it ran"], rows,
                        colour=colour)


def describe_step_cost(cost: Mapping[str, Any]) -> str:
    """``x1.84 (46.1 ms vs 25.0 ms before)``, or what is missing."""
    if "ratio" in cost:
        return (f"x{cost['ratio']:.2f} ({cost['window_ms']:.1f} ms vs {cost['before_ms']:.1f} "
                "ms before)")
    if "window_ms" in cost:
        return f"{cost['window_ms']:.1f} ms (no earlier steps)"
    return "-"
