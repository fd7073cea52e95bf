"""The resolver's CUDA-row bookkeeping, without a GPU.

CI has no GPU, so the real CUDA path (``tests/integration/tracing/test_tracing_safety.py``) skips
there. The resolver's handling of records that carry CUDA events is plain Python and SQL, though:
rows wait until their end event completes, take their duration from the event pair and their memory
columns from the allocator snapshot, and the first such row of a flush must not lose either
(it did once). ``Event`` stands in for ``torch.cuda.Event``: ``query()`` and ``elapsed_time()``
are the only calls the resolver makes on it.
"""

from __future__ import annotations

from array import array

import pytest

pytest.importorskip("pyarrow")
nn = pytest.importorskip("torch.nn")

from probe_agent.collectors.tracer.trace_columns import FORWARD, PASS_END  # noqa: E402
from probe_agent.collectors.tracer.trace_rows import RowResolver  # noqa: E402
from tests.support import ddl_schemas  # noqa: E402


class Event:
    def __init__(self, t: float, done: bool = True) -> None:
        self.t, self.done = t, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: Event) -> float:  # milliseconds, like torch.cuda.Event
        return (end.t - self.t) * 1e3


MEM = (1.0, 2.0, 3.0, 4.0)


def resolve(resolver: RowResolver, rows: list[tuple], objs: list, events: list[tuple],
            root: object = None) -> list:
    """rows: (t0, t1, depth, gseq, (ev0, ev1) or None); events: (t, gseq, event or None)."""
    fw, fcuda = array("q"), []
    for t0, t1, depth, gseq, evs in rows:
        fw.extend((t0, t1, 1, FORWARD, depth, gseq, 1 if evs else 0, -1))
        if evs:
            fcuda.append((*evs, MEM))
    bw, bcuda = array("q"), []
    for t, gseq, ev in events:
        bw.extend((t, gseq, 1 if ev else 0))
        if ev:
            bcuda.append((ev, MEM if gseq != PASS_END else None))
    tables = resolver.resolve(fw, objs, [root] * len(objs), fcuda,
                              bw, bcuda, lambda evs: None)
    return [r for t in tables for r in t.to_pylist()]


def test_cuda_rows_take_event_durations_and_memory_and_wait_for_unfinished_events():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    resolver = RowResolver(0, ddl_schemas()["python.torch_trace"])
    late = Event(0.030, done=False)
    rows = [(10, 20, 1, -1, (Event(0.010), Event(0.020))),
            (21, 30, 1, -1, (Event(0.021), late)),
            (5, 31, 0, 100, (Event(0.005), Event(0.031)))]
    events = [(40, 100, Event(0.040)), (45, PASS_END, Event(0.045))]
    # WHEN a flush holds CUDA rows, one of whose end events has not completed
    first = resolve(resolver, rows, [model[0], model[1], model], events, model)
    got = {(r["module"], r["stage"]): r for r in first}
    # THEN finished rows are out with the GPU duration and the allocator's numbers, the first
    # row of the flush included
    assert set(got) == {("0", "forward"), ("Sequential", "forward"),
                        ("Sequential", "backward")}
    assert got["0", "forward"]["duration"] == pytest.approx(0.010)
    assert got["0", "forward"]["cpu_duration"] == pytest.approx(10e-9)
    assert got["Sequential", "backward"]["duration"] == pytest.approx(0.005)
    for r in first:
        assert r["device"] == "cuda"
        assert (r["allocated"], r["max_allocated"], r["cached"], r["max_cached"]) == MEM
    # ... and the unfinished one comes out on a later flush, once its event completes
    assert resolve(resolver, [], [], []) == []
    late.done = True
    later = resolve(resolver, [], [], [])
    assert [(r["module"], r["stage"], r["device"]) for r in later] == [("1", "forward", "cuda")]
    assert later[0]["duration"] == pytest.approx(0.009)


def test_rows_without_an_event_pair_keep_host_time_beside_cuda_rows():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    resolver = RowResolver(0, ddl_schemas()["python.torch_trace"])
    # WHEN one row recorded no events (the CPU side of a CUDA step) and one did
    got = resolve(resolver, [(10, 20, 1, -1, None), (21, 30, 1, -1, (Event(0.0), Event(0.5)))],
                  [model[0], model[1]], [], model)
    by = {r["module"]: r for r in got}
    # THEN the first keeps its host time on the cpu device, the second takes the GPU time
    assert (by["0"]["device"], by["0"]["duration"]) == ("cpu", pytest.approx(10e-9))
    assert (by["1"]["device"], by["1"]["duration"]) == ("cuda", pytest.approx(0.5))
