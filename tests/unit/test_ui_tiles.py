"""The dashboard's tile states come from the hang verdict's own rule: a collective is "waiting"
only once it has been pending as long as `probe hang` calls stuck for this job (its rhythm),
not after a fixed half second that every healthy job with long steps exceeds."""

from __future__ import annotations

from probe_cli.diagnose.hang import diagnose, rank_state
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
