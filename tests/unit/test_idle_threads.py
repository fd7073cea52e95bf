"""The agent's request pools and its query-deadline thread end their threads when idle, so a
quiet agent is back to its own few threads after a burst (bench/bench_footprint.py)."""

from __future__ import annotations

import threading
import time

import pytest

from probe_agent.serving.idle_pool import IdlePool
from probe_agent.store.deadlines import Deadlines
from tests.support import wait_until


def _named(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


def test_pool_runs_a_burst_at_full_width_then_ends_its_threads() -> None:
    # GIVEN a pool of 3 whose threads end after 0.2 s idle
    pool = IdlePool(3, "test-idle.pool", idle_s=0.2)
    gate = threading.Barrier(4)  # only passes when 3 calls run at once (and this thread)

    def call(i: int) -> int:
        gate.wait(5)
        return i * 2

    # WHEN a burst of 3 blocking calls, then 3 more, then nothing
    futs = [pool.submit(call, i) for i in range(3)]
    gate.wait(5)
    assert [f.result(5) for f in futs] == [0, 2, 4]
    assert len(_named("test-idle.pool")) <= 3
    assert [f.result(5) for f in [pool.submit(lambda i=i: i) for i in range(3)]] == [0, 1, 2]
    # THEN the threads end once idle, and a later call starts one again
    wait_until(lambda: not _named("test-idle.pool"), 5, "idle pool threads did not end")
    assert pool.submit(lambda: "again").result(5) == "again"
    pool.shutdown(wait=True)
    assert not _named("test-idle.pool")


def test_pool_queues_past_its_width_and_reports_errors() -> None:
    # GIVEN a pool of 1 busy with a slow call
    pool = IdlePool(1, "test-idle.one", idle_s=5)
    release = threading.Event()
    slow = pool.submit(release.wait, 5)
    queued = pool.submit(lambda: 1 / 0)
    # WHEN it is released, THEN the queued call runs on the same thread and raises to its caller
    assert len(_named("test-idle.one")) == 1
    release.set()
    assert slow.result(5) is True
    with pytest.raises(ZeroDivisionError):
        queued.result(5)
    # AND shutdown with cancel_futures cancels what has not started
    blocker = threading.Event()
    pool.submit(blocker.wait, 5)
    pending = pool.submit(lambda: "never")
    pool.shutdown(wait=False, cancel_futures=True)
    blocker.set()
    assert pending.cancelled()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(lambda: None)
    wait_until(lambda: not _named("test-idle.one"), 5, "pool threads did not end at shutdown")


def test_deadlines_thread_ends_when_nothing_is_armed_and_restarts() -> None:
    # GIVEN deadlines whose thread ends after 0.2 s with nothing armed
    d = Deadlines("test-idle.deadlines", idle_s=0.2)
    fired = threading.Event()
    d.disarm(d.arm(60, fired.set))  # a query's deadline, disarmed when the query ends
    assert _named("test-idle.deadlines")
    # WHEN nothing more is armed, THEN the thread ends (not after the disarmed one's 60 s)
    wait_until(lambda: not _named("test-idle.deadlines"), 5, "deadlines thread did not end")
    # AND a new deadline starts it again, and fires
    t0 = time.monotonic()
    d.arm(0.05, fired.set)
    assert fired.wait(5) and time.monotonic() - t0 < 5
    d.stop()
    wait_until(lambda: not _named("test-idle.deadlines"), 5, "deadlines thread did not stop")


def test_a_cpu_time_deadline_ignores_waiting_and_fires_on_work() -> None:
    """A query on a thread that yields the CPU to training may wait long for the cores: its
    deadline counts its own CPU time (bounded by a wall limit), not the wait."""
    import time as _time

    d = Deadlines("test-cpu.deadlines", idle_s=0.2)
    fired: list[str] = []
    try:
        # WHEN the block waits (no CPU used) past the CPU limit, THEN nothing fires
        with d.on_cpu_time(0.1, 5.0, lambda: fired.append("wait")):
            _time.sleep(0.4)
        # WHEN the block burns CPU past the limit, THEN it fires
        with d.on_cpu_time(0.1, 5.0, lambda: fired.append("work")):
            end = _time.monotonic() + 3.0
            while not fired and _time.monotonic() < end:
                sum(range(10_000))
        # AND the wall limit bounds a block that only waits
        with d.on_cpu_time(5.0, 0.2, lambda: fired.append("wall")):
            end = _time.monotonic() + 3.0
            while len(fired) < 2 and _time.monotonic() < end:
                _time.sleep(0.02)
    finally:
        d.stop()
    assert fired == ["work", "wall"]
