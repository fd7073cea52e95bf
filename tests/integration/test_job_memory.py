"""``python.job_memory``: the one definition of "the job's memory" (RSS minus the agent's share
and the free heap on CPU, CUDA allocated on a GPU), read by `probe memory`, doctor, the dashboard
and ``/v1/metrics``; and the store treats it as a view: read, never written or trimmed."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("duckdb")
pa = pytest.importorskip("pyarrow")

from probe_agent.store.catalog import load_queries  # noqa: E402
from probe_agent.store.store import Store  # noqa: E402


def _memory_rows(store: Store, steps: range, device: str = "cpu") -> pa.Table:
    schema = store.arrow_schema("python.memory")
    n = len(steps)
    cols = {f.name: [None] * n for f in schema}
    cols |= {
        "timestamp": [time.time()] * n, "rank": [0] * n, "step": list(steps),
        "device": [device] * n, "allocated": [50.0 if device != "cpu" else None] * n,
        "reserved": [None] * n, "active": [None] * n, "peak": [None] * n,
        "alloc_retries": [None] * n, "ooms": [None] * n, "rss": [1000.0] * n,
        "agent_mib": [300.0] * n, "agent_threads": [6] * n, "heap_free_mib": [200.0] * n,
    }
    return pa.table(cols, schema=schema)


def test_job_memory_is_rss_less_agent_less_free_heap_and_cuda_allocated(store):
    # GIVEN memory rows of a CPU device and a CUDA device, queued but not flushed
    store.append("python.memory", _memory_rows(store, range(1, 4)))
    store.append("python.memory", _memory_rows(store, range(1, 4), device="cuda:0"))
    # WHEN the view is read (a read names only the view, not python.memory)
    res = store.query("SELECT device, measure, job_mib, host_mib FROM python.job_memory "
                      "WHERE step = 3 ORDER BY device")
    # THEN the read flushed the view's table, and each device has its one measure
    assert res.rows == [["cpu", "job RSS", 500.0, 500.0],
                        ["cuda:0", "CUDA allocated", 50.0, 500.0]]


def test_a_view_is_neither_written_nor_trimmed(store):
    # GIVEN the store's own picture of its tables
    assert "python.job_memory" not in store._step_tables
    assert "python.memory" in store._step_tables
    assert "python.memory" in store.tables_named("SELECT * FROM job_memory")
    # WHEN more memory rows than PROBE_RETENTION_MB (1) holds arrive
    width = store._step_tables["python.memory"]
    n = 2 * (1 << 20) // width
    store.append("python.memory", _memory_rows(store, range(1, n + 1)))
    store.flush()

    # THEN retention trims the table under the view (a DELETE on the view would fail the pass)
    def trimmed() -> bool:
        return store.query("SELECT min(step) FROM python.memory").rows[0][0] > 1

    deadline = time.monotonic() + 15
    while not trimmed():
        assert time.monotonic() < deadline, "retention never trimmed python.memory"
        store.flush(timeout=1.0)
    assert store.rows_dropped > 0


def test_memory_growth_reads_the_view(store):
    """`probe memory` and doctor read memory_growth: its measure is the view's job_mib."""
    store.append("python.memory", _memory_rows(store, range(1, 21)))
    q = load_queries()["memory_growth"]
    assert "python.job_memory" in q.sql
    res = store.query(q.sql, params={p: 0 if p == "warmup" else 100 for p in q.params})
    row = dict(zip(res.columns, res.rows[0], strict=True))
    assert row["measure"] == "job RSS" and row["mem_last_mib"] == 500.0


def test_the_cost_queries_of_profile_and_flame_windows(store):
    """The agent's own step-time reads (sql/queries/step_times_*.sql): the steps wholly inside a
    window, and the last N before it."""
    from probe_agent.store.catalog import shipped_sql

    schema = store.arrow_schema("python.steps")
    steps = list(range(1, 31))
    cols = {f.name: [None] * len(steps) for f in schema}
    cols.update(rank=[0] * 30, step=steps, start_time=[float(s) for s in steps],
                end_time=[s + 0.5 for s in steps], duration=[s / 100 for s in steps])
    store.append("python.steps", pa.table(cols, schema=schema))
    inside = store.query(shipped_sql("step_times_window"),
                         params={"since": 20.0, "until": 25.9}).rows
    before = store.query(shipped_sql("step_times_before"),
                         params={"step": 2**62, "until": 20.0, "last": 5}).rows
    upto = store.query(shipped_sql("step_times_before"),
                       params={"step": 10, "until": time.time(), "last": 20}).rows
    assert [r[0] for r in inside] == [0.20, 0.21, 0.22, 0.23, 0.24, 0.25]
    assert [r[0] for r in before] == [0.19, 0.18, 0.17, 0.16, 0.15]
    assert len(upto) == 10 and upto[0][0] == 0.10
