"""probe_cli.export.perfetto: trace_timeline rows -> Chrome/Perfetto JSON (pure, stdlib only)."""

from __future__ import annotations

import json

from probe_cli.export.perfetto import TRACKS, build_trace

COLS = ["rank", "step", "seq", "root", "module", "stage", "depth", "recompute", "timestamp",
        "duration", "cpu_duration", "allocated", "device"]


def row(rank, step, module, stage, ts, dur, depth=0, recompute=False, gpu=None):
    return [rank, step, 0, "GPT", module, stage, depth, recompute, ts,
            gpu if gpu is not None else dur, dur, 0.0, "cpu"]


def test_rows_become_nested_slices_per_rank_and_stage():
    # GIVEN a parent and a child forward call, a backward and an optimizer step on two ranks
    rows = [
        row(0, 5, "GPT", "forward", 100.000, 0.010),
        row(0, 5, "h.0", "forward", 100.001, 0.004, depth=1),
        row(0, 5, "GPT", "backward", 100.011, 0.020),
        row(0, 5, "AdamW", "step", 100.032, 0.002),
        row(0, 5, "h.0", "forward", 100.031, 0.001, depth=1, recompute=True),
        row(1, 5, "GPT", "forward", 100.000, 0.012, gpu=0.009),
    ]
    # WHEN they are turned into a trace
    trace = build_trace(COLS, rows)
    json.dumps(trace)  # serialisable as is
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    # THEN each rank is a process, each stage a track, times in microseconds
    assert {e["args"]["name"] for e in meta if e["name"] == "process_name"} == {"rank 0", "rank 1"}
    by = {(e["pid"], e["tid"], e["name"]): e for e in spans}
    parent = by[(0, TRACKS["forward"], "GPT")]
    child = by[(0, TRACKS["forward"], "h.0")]
    assert parent["ts"] == 100.0e6 and round(parent["dur"]) == 10_000
    assert parent["ts"] <= child["ts"]
    assert child["ts"] + child["dur"] <= parent["ts"] + parent["dur"]
    assert (0, TRACKS["backward"], "GPT") in by and (0, TRACKS["step"], "AdamW") in by
    assert (0, TRACKS["recompute"], "h.0") in by
    # the host span draws the slice; the GPU time is in the args
    gpu = by[(1, TRACKS["forward"], "GPT")]
    assert round(gpu["dur"]) == 12_000 and gpu["args"]["duration_ms"] == 9.0
    # AND each rank-step gets a slice covering all of its rows
    step = by[(0, TRACKS["steps"], "step 5")]
    assert step["ts"] == 100.0e6 and round(step["ts"] + step["dur"]) == round(100.034e6)


def test_no_rows_is_an_empty_trace():
    assert build_trace(COLS, []) == {"traceEvents": [], "displayTimeUnit": "ms"}
