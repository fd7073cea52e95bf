"""The resolver's CUDA-row bookkeeping, without a GPU.

CI has no GPU, so the real CUDA path (``tests/integration/test_tracing_safety.py``) skips there.
The resolver's handling of rows that carry CUDA events is plain Python and Arrow, though: rows
wait until their end event completes, take their duration from the event pair and their memory
columns from the allocator snapshot, and the first such row of a flush must not lose either
(it did once). ``Event`` stands in for ``torch.cuda.Event``: ``query()`` and ``elapsed_time()``
are the only calls the resolver makes on it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("pyarrow")
nn = pytest.importorskip("torch.nn")

from probe_agent.collectors.trace_rows import RowResolver  # noqa: E402


class Event:
    def __init__(self, t: float, done: bool = True) -> None:
        self.t, self.done = t, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: Event) -> float:  # milliseconds, like torch.cuda.Event
        return (end.t - self.t) * 1e3


MEM = (1.0, 2.0, 3.0, 4.0)


def row(t0: int, t1: int, ev0: Event | None, ev1: Event | None, kind: int = 0,
        depth: int = 1) -> tuple:
    return (t0, t1, None, None, 1, kind, ev0, ev1, MEM if ev0 else None, depth)


def test_cuda_rows_take_event_durations_and_memory_and_wait_for_unfinished_events():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    resolver = RowResolver(0, SimpleNamespace())
    late = Event(0.030, done=False)
    rows = [row(10, 20, Event(0.010), Event(0.020)),
            row(21, 30, Event(0.021), late),
            row(5, 31, Event(0.005), Event(0.031), depth=0)]
    events = [(40, (rows[2],), Event(0.040), MEM), (45, None, Event(0.045), None)]
    # WHEN a flush holds CUDA rows, one of whose end events has not completed
    first = [r for t in resolver.resolve(rows, [model[0], model[1], model], [model] * 3,
                                         events, lambda evs: None) for r in t.to_pylist()]
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
    assert resolver.resolve([], [], [], [], lambda evs: None) == []
    late.done = True
    later = [r for t in resolver.resolve([], [], [], [], lambda evs: None) for r in t.to_pylist()]
    assert [(r["module"], r["stage"], r["device"]) for r in later] == [("1", "forward", "cuda")]
    assert later[0]["duration"] == pytest.approx(0.009)
