"""The streaming trace merge and the flame-graph folding of `probe profile` / `probe flame`
(issue 16): stdlib only, on small hand-made Kineto-shaped traces."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from probe_cli.export import trace_merge
from probe_cli.export.flame import (
    flame_tables,
    merge_folded,
    rank_differences,
    to_speedscope,
    widest_frames,
)
from probe_cli.export.flame_svg import to_html, to_svg
from probe_cli.export.op_stats import OpStats
from probe_cli.export.trace_merge import RankTrace, TraceFormatError, merge_traces, read_trace
from probe_cli.render.flame import render_flame

BASE_NS = 1_700_000_000_000_000_000  # Kineto's baseTimeNanoseconds: epoch, whole seconds


def kineto_trace(path: Path, pid: int, start_us: float) -> None:
    """A trace shaped like torch.profiler's export: metadata, CPU ops, a step span, a GPU
    kernel on device pid 0 with its flow arrow, keys after the events, pretty-printed."""
    events = [
        {"ph": "M", "name": "process_name", "ts": start_us, "pid": pid, "tid": 0,
         "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "ts": start_us, "pid": pid, "tid": pid,
         "args": {"name": f"thread {pid} (python)"}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#8", "pid": pid, "tid": pid,
         "ts": start_us, "dur": 1000.5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": pid, "tid": pid,
         "ts": start_us + 10, "dur": 123.25, "args": {"Input Dims": [[2, 3]], "note": "a]b,{"}},
        {"ph": "M", "name": "thread_name", "ts": start_us, "pid": 0, "tid": 7,
         "args": {"name": "stream 7"}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": start_us + 50,
         "dur": 9},
        {"ph": "s", "id": 5, "cat": "ac2g", "name": "ac2g", "pid": pid, "tid": pid,
         "ts": start_us + 10},
        {"ph": "f", "id": 5, "bp": "e", "cat": "ac2g", "name": "ac2g", "pid": 0, "tid": 7,
         "ts": start_us + 50},
    ]
    doc = {"schemaVersion": 1, "deviceProperties": [], "displayTimeUnit": "ms",
           "baseTimeNanoseconds": BASE_NS, "traceEvents": events, "traceName": str(path)}
    path.write_text(json.dumps(doc, indent=2))


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 7 characters: every value and event straddles reads."""
    monkeypatch.setattr(trace_merge, "CHUNK", 7)


def test_read_trace_streams_keys_and_events_across_chunk_boundaries(tmp_path, small_chunks):
    # GIVEN
    path = tmp_path / "r.json"
    kineto_trace(path, pid=4242, start_us=12345678.5)
    expected = json.loads(path.read_text())
    # WHEN
    with open(path) as f:
        items = list(read_trace(f))
    # THEN every event and every top-level key comes back intact, in file order
    assert [v for k, v in items if k == "event"] == expected["traceEvents"]
    assert dict(v for k, v in items if k == "key")["baseTimeNanoseconds"] == BASE_NS
    assert [v[0] for k, v in items if k == "key"][-1] == "traceName"


def test_read_trace_rejects_what_is_not_a_trace(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"traceEvents": [{"ph": "X"} {"ph": "X"}]}')
    with open(path) as f, pytest.raises(TraceFormatError):
        list(read_trace(f))


def test_merge_places_each_rank_in_its_own_process_on_a_common_clock(tmp_path, small_chunks):
    # GIVEN two ranks whose windows started 2 ms apart on hosts whose clocks differ by 0.5 s
    base_s = BASE_NS / 1e9
    kineto_trace(tmp_path / "r0.json", pid=100, start_us=5_000_000.0)
    kineto_trace(tmp_path / "r1.json", pid=200, start_us=5_500_000.0 + 2_000.0)
    traces = [
        RankTrace(0, str(tmp_path / "r0.json"), pid=100, window_start=base_s + 5.0, host="a"),
        RankTrace(1, str(tmp_path / "r1.json"), pid=200, clock_offset_s=0.5,
                  window_start=base_s + 5.502, host="b"),
    ]
    out = tmp_path / "merged.json"
    # WHEN
    report = merge_traces(traces, str(out))
    # THEN
    events = json.loads(out.read_text())["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}  # Kineto's own "python" names are replaced
    steps = {e["pid"]: e["ts"] for e in events if e.get("name") == "ProfilerStep#8"}
    assert steps[0] == pytest.approx(0.0) and steps[1] == pytest.approx(2_000.0)
    kernels = [e for e in events if e.get("name") == "gemm"]
    assert {e["pid"] for e in kernels} == {0, 1}  # device rows belong to their rank
    assert all(e["tid"] == trace_merge._DEVICE_TID + 7 for e in kernels)
    gpu_names = {e["args"]["name"] for e in events
                 if e.get("name") == "thread_name" and e["tid"] >= trace_merge._DEVICE_TID}
    assert gpu_names == {"GPU 0 stream 7"}
    flows = {(e["pid"], e["id"]) for e in events if e.get("ph") in ("s", "f")}
    assert len({fid for _, fid in flows}) == 2  # one arrow per rank, never crossing ranks
    assert report.events == {0: 7, 1: 7} and report.steps == {0: ["ProfilerStep#8"],
                                                              1: ["ProfilerStep#8"]}
    assert not (tmp_path / "merged.json.part").exists()


FOLDED = {
    0: {"MainThread;main (t.py:1);step (t.py:5);slow (t.py:9)": 70,
        "MainThread;main (t.py:1);step (t.py:5)": 30},
    1: {"MainThread;main (t.py:1);step (t.py:5);slow (t.py:9)": 10,
        "MainThread;main (t.py:1);step (t.py:5)": 90},
    2: {"MainThread;main (t.py:1);step (t.py:5);slow (t.py:9)": 12,
        "MainThread;main (t.py:1);step (t.py:5)": 88},
}


def test_rank_differences_name_the_rank_far_above_the_median():
    diffs = rank_differences(FOLDED)
    assert [(d["rank"], d["frame"]) for d in diffs] == [(0, "slow (t.py:9)")]
    assert diffs[0]["pct"] == pytest.approx(70.0) and diffs[0]["median_pct"] == pytest.approx(12)


def test_widest_frames_and_outputs():
    widest = widest_frames(FOLDED)
    assert [w["frame"] for w in widest[:3]] == ["main (t.py:1)", "step (t.py:5)",
                                                "slow (t.py:9)"]
    merged = merge_folded(FOLDED)
    assert merged["rank 1;MainThread;main (t.py:1);step (t.py:5)"] == 90
    speedscope = to_speedscope(FOLDED, "t")
    assert [p["endValue"] for p in speedscope["profiles"]] == [100, 100, 100]
    frames = speedscope["shared"]["frames"]
    assert {"name": "slow", "file": "t.py", "line": 9} in frames
    svg = to_svg(merged, "t <&>")
    ET.fromstring(svg)  # well-formed, labels escaped
    html = to_html(svg, "t", render_flame(flame_tables(FOLDED)))
    assert "rank differences" in html and "<script" not in html


def test_op_stats_self_time_subtracts_the_spans_directly_inside():
    # GIVEN addmm (100 us) around mm (60) around copy_ (10), on two threads, and a kernel
    stats = OpStats()
    for tid in (1, 2):
        stats.add({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 0, "tid": tid,
                   "ts": 0.0, "dur": 100.0})
        stats.add({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 0, "tid": tid,
                   "ts": 10.0, "dur": 60.0})
        stats.add({"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": 0, "tid": tid,
                   "ts": 20.0, "dur": 10.0})
    stats.add({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 15.0,
               "dur": 30.0})
    stats.add({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 0,
               "tid": 1, "ts": 0.0, "dur": 500.0})
    # WHEN
    top = {r["name"]: r for r in stats.top(10)}
    # THEN
    assert {n: (r["calls"], r["self_us"]) for n, r in top.items()} == {
        "aten::addmm": (2, 80.0), "aten::mm": (2, 100.0), "aten::copy_": (2, 20.0),
        "gemm": (1, 0.0)}
    assert top["gemm"]["self_device_us"] == 30.0 and top["aten::addmm"]["total_us"] == 200.0


def test_parallel_conversion_writes_the_same_trace(tmp_path, monkeypatch):
    # GIVEN three ranks, and any input large enough for worker processes
    monkeypatch.setattr(trace_merge, "PARALLEL_BYTES", 0)
    traces = []
    for r in range(3):
        kineto_trace(tmp_path / f"r{r}.json", pid=100 + r, start_us=1000.0 * r)
        traces.append(RankTrace(r, str(tmp_path / f"r{r}.json"), pid=100 + r,
                                window_start=BASE_NS / 1e9 + r / 1e3))
    # WHEN
    one = merge_traces(traces, str(tmp_path / "one.json"), workers=1)
    two = merge_traces(traces, str(tmp_path / "two.json"), workers=2)
    # THEN
    assert (tmp_path / "one.json").read_bytes() == (tmp_path / "two.json").read_bytes()
    assert (one.events, one.steps, one.ops) == (two.events, two.steps, two.ops)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "one.json", "r0.json", "r1.json", "r2.json", "two.json"]  # no part file left
