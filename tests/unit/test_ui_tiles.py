"""The dashboard's tile states come from the hang verdict's own rule: a collective is "waiting"
only once it has been pending as long as `probe hang` calls stuck for this job (its rhythm),
not after a fixed half second that every healthy job with long steps exceeds."""

from __future__ import annotations

from probe_cli.diagnose.hang import diagnose
from probe_cli.diagnose.hang_state import rank_state
from probe_cli.result import RankResult
from probe_cli.ui.snapshot import build_tiles


def _rank(rank: int, now: float, pending_for: float | None, gaps: float) -> RankResult:
    """A rank whose collectives started every ``gaps`` s, the last one pending ``pending_for``."""
    done = [{"group": "0", "seq": i, "op": "all_reduce", "state": "completed",
             "start_time": now - 100 + i * gaps, "end_time": now - 100 + i * gaps + 0.01}
            for i in range(10)]
    pending = [] if pending_for is None else [
        {"group": "0", "seq": 10, "op": "all_reduce", "state": "pending",
         "start_time": now - pending_for, "end_time": None}]
    data = {"ok": True, "rank": rank,
            "backtrace": {"ok": True, "rank": rank, "threads": []},
            "collectives": {"ok": True, "rank": rank, "now": now,
                            "collectives": done + pending}}
    return RankResult(rank=rank, url=f"http://h:{rank}", ok=True, data=data)


def _tiles(pending_for: float, gaps: float) -> list[str]:
    now = 1_000.0
    results = [_rank(0, now, pending_for, gaps), _rank(1, now, pending_for, gaps)]
    hang = diagnose([rank_state(r) for r in results]).to_dict()
    return [t["state"] for t in build_tiles(results, hang, now)]


def test_a_wait_the_jobs_rhythm_calls_normal_is_training():
    # GIVEN a job that starts a collective every 2 s (stuck means 8 s by its rhythm)
    # WHEN both ranks are 1.5 s into an all_reduce
    # THEN no tile says waiting (a fixed 0.5 s rule said so on every healthy step)
    assert _tiles(pending_for=1.5, gaps=2.0) == ["training", "training"]


def test_a_wait_past_the_rhythm_is_not_training():
    # GIVEN the same job, WHEN both ranks have waited 30 s
    states = _tiles(pending_for=30.0, gaps=2.0)
    # THEN the tiles show the stuck wait, as the hang verdict does
    assert states == ["waiting", "waiting"]


def test_a_snapshot_nobody_refreshed_for_a_while_is_not_shown_as_the_job():
    """The refresh stops while nobody looks (idle_s): a page opened later painted the last
    snapshot, green, 72 s old, over a job that had hung since."""
    import time

    from probe_cli.transport.session import Session
    from probe_cli.transport.targets import Endpoint
    from probe_cli.ui.snapshot import Snapshotter

    snaps = Snapshotter(Session(endpoints=[Endpoint("http://127.0.0.1:9")]))
    green = {"tiles": [{"rank": 0, "state": "training"}],
             "verdicts": {"hang": {"problem": False, "headline": "no hang"}}}
    # GIVEN the last snapshot was taken 72 s ago
    snaps.snapshot = {**green, "refreshed_at": time.time() - 72}
    # WHEN the page asks for it, THEN it gets no state and how old the last answer is
    old = snaps.current()
    assert old["tiles"] == [] and old["verdicts"] == {} and old["stale_s"] >= 72, old
    # AND a snapshot of the last refreshes is served as it is
    snaps.snapshot = fresh = {**green, "refreshed_at": time.time() - 2}
    assert snaps.current() is fresh
