"""Chrome/Perfetto trace JSON from ``trace_timeline`` rows (pure; stdlib only).

One process per rank (``pid`` = rank), one track per stage: forward, backward, optimizer and
activation-checkpoint recompute, plus a ``steps`` track with one slice per step. Slices use the
host span (``cpu_duration``) so that nested module calls nest in the viewer; on CUDA the GPU
time is in each slice's args. Opens in ui.perfetto.dev and chrome://tracing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

TRACKS = {"steps": 0, "forward": 1, "backward": 2, "step": 3, "recompute": 4}
TRACK_NAMES = {0: "steps", 1: "forward", 2: "backward", 3: "optimizer", 4: "recompute"}


def build_trace(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> dict[str, Any]:
    """Rows of the trace_timeline query (any ranks) -> ``{"traceEvents": [...], ...}``."""
    idx = {c: i for i, c in enumerate(columns)}
    events: list[dict[str, Any]] = []
    ranks: set[int] = set()
    span: dict[tuple[int, int], list[float]] = {}
    for row in rows:
        rank = int(row[idx["rank"]])
        step = int(row[idx["step"]])
        stage = row[idx["stage"]]
        ts = float(row[idx["timestamp"]]) * 1e6
        host = row[idx["cpu_duration"]]
        dur = float(host if host is not None else row[idx["duration"]] or 0.0) * 1e6
        recompute = bool(row[idx["recompute"]]) if "recompute" in idx else False
        tid = TRACKS["recompute"] if recompute else TRACKS.get(stage, 1)
        ranks.add(rank)
        args = {
            "step": step, "seq": row[idx["seq"]], "root": row[idx.get("root", idx["module"])],
            "duration_ms": _ms(row[idx["duration"]]), "cpu_duration_ms": _ms(host),
        }
        if "allocated" in idx and row[idx["allocated"]]:
            args["allocated_mib"] = row[idx["allocated"]]
        events.append({"name": row[idx["module"]], "cat": stage, "ph": "X", "ts": ts,
                       "dur": dur, "pid": rank, "tid": tid, "args": args})
        lo_hi = span.setdefault((rank, step), [ts, ts + dur])
        lo_hi[0] = min(lo_hi[0], ts)
        lo_hi[1] = max(lo_hi[1], ts + dur)
    for (rank, step), (lo, hi) in sorted(span.items()):
        events.append({"name": f"step {step}", "cat": "step", "ph": "X", "ts": lo,
                       "dur": hi - lo, "pid": rank, "tid": TRACKS["steps"],
                       "args": {"step": step}})
    meta: list[dict[str, Any]] = []
    for rank in sorted(ranks):
        meta.append({"name": "process_name", "ph": "M", "pid": rank,
                     "args": {"name": f"rank {rank}"}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": rank,
                     "args": {"sort_index": rank}})
        for tid, name in TRACK_NAMES.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                         "args": {"name": name}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid,
                         "args": {"sort_index": tid}})
    # Parents before children at equal start times, so viewers nest them.
    events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def _ms(seconds: Any) -> float | None:
    return None if seconds is None else round(float(seconds) * 1e3, 4)
