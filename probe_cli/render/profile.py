"""Pure rendering for `probe profile`: the top operators of each rank side by side, the
ranks' step spans side by side, and the cost line. Stdlib only; nothing here prints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..result import RankResult
from .actions import human_bytes
from .text import format_table

#: Operators shown per rank.
TOP = 10


def window_of(r: RankResult) -> dict[str, Any]:
    return (r.data or {}).get("profile") or {}


def _ms(us: Any) -> str:
    return f"{float(us) / 1e3:.2f}" if isinstance(us, (int, float)) else ""


def render_top_ops(ops: Mapping[int, list[dict[str, Any]]], top: int = TOP,
                   colour: bool = False) -> list[str]:
    """One block of columns per rank: operator, self ms, calls; rows by self time.

    Args:
        ops: per rank, its operators by self time (export/op_stats.py, from its trace).
    """
    ranks = sorted(ops.items())
    if not ranks:
        return []
    device = any(op.get("self_device_us") for _, mine in ranks for op in mine)
    headers: list[str] = []
    for rank, _ in ranks:
        headers += [f"rank {rank} operator", "self_ms"] + (["dev_ms"] if device else []) + [
            "calls"]
    rows = []
    for i in range(min(top, max(len(mine) for _, mine in ranks))):
        row: list[Any] = []
        for _, mine in ranks:
            op = mine[i] if i < len(mine) else {}
            row += [op.get("name", ""), _ms(op.get("self_us"))]
            if device:
                row.append(_ms(op.get("self_device_us")))
            row.append(op.get("calls", ""))
        rows.append(row)
    return ["top operators by self time (each rank's profiled steps together)",
            *format_table(headers, rows, colour=colour)]


def render_step_spans(results: Sequence[RankResult], origin_s: float, offsets: dict[Any, float],
                      colour: bool = False) -> list[str]:
    """Per step, each rank's start (ms from the earliest window start, common clock) and
    duration, and the spread of the ends across ranks."""
    by_step: dict[int, dict[Any, dict[str, Any]]] = {}
    for r in results:
        for s in window_of(r).get("step_spans") or []:
            by_step.setdefault(int(s["step"]), {})[r.rank] = s
    ranks = [r.rank for r in results]
    headers = ["step"]
    for rank in ranks:
        headers += [f"r{rank} start_ms", f"r{rank} ms"]
    headers.append("end_spread_ms")
    rows = []
    for step in sorted(by_step):
        row: list[Any] = [step]
        ends = []
        for rank in ranks:
            s = by_step[step].get(rank)
            if s is None:
                row += ["", ""]
                continue
            start = (s["start"] - offsets.get(rank, 0.0) - origin_s) * 1e3
            ends.append(s["end"] - offsets.get(rank, 0.0))
            row += [f"{start:.2f}", f"{s['ms']:.2f}"]
        row.append(f"{(max(ends) - min(ends)) * 1e3:.2f}" if len(ends) > 1 else "")
        rows.append(row)
    return ["step spans (ms; start from the earliest window start on a common clock)",
            *format_table(headers, rows, colour=colour)]


def cost_lines(results: Sequence[RankResult]) -> list[str]:
    """The measured cost per profiled step, one line (stderr), ranks grouped."""
    parts = []
    for r in results:
        c = window_of(r).get("cost") or {}
        if "ratio" in c:
            parts.append(f"rank {r.rank} x{c['ratio']:.2f} ({c['window_ms']:.1f} ms vs "
                         f"{c['before_ms']:.1f} ms)")
        elif "window_ms" in c:
            parts.append(f"rank {r.rank} {c['window_ms']:.1f} ms (no earlier steps)")
    if not parts:
        return []
    paused = any(window_of(r).get("tracer_paused") for r in results)
    return ["probe: profiling cost, median step time in the window vs the 20 steps before: "
            + ", ".join(parts)
            + (" (the module tracer was paused for the window: no python.torch_trace rows for "
               "those steps)" if paused else "")]


def trace_line(path: str, size: int, ranks: int, steps: dict[int, list[str]]) -> str:
    got = ", ".join(f"rank {r}: {len(s)}" for r, s in sorted(steps.items()))
    return (f"probe: merged trace of {ranks} rank(s) written to {path} ({human_bytes(size)}; "
            f"ProfilerStep spans {got}); open it in https://ui.perfetto.dev or chrome://tracing")


def stopped_notes(results: Sequence[RankResult]) -> list[str]:
    out = []
    for r in results:
        w = window_of(r)
        by = w.get("stopped_by") or ""
        if by and not by.startswith("step "):
            out.append(f"probe: rank {r.rank}'s profiler was stopped by {by}, before step "
                       f"{w.get('last_step')}: its trace covers fewer steps")
    return out
