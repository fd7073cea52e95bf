"""The hang verdict on hand-built rank states: which rank is named, and why (pure, no I/O)."""

from __future__ import annotations

from probe_cli.diagnose.hang import RankState, diagnose
from probe_cli.render.verdicts import render_verdict

NOW = 1_000.0
TRAIN = {"func": "train_step", "file": "/job/train.py", "lineno": 47}
MAIN = {"func": "main", "file": "/job/train.py", "lineno": 90}


def coll(seq, op="all_reduce", state="done", started=NOW - 60, site="/job/train.py:47 train_step",
         ranks=(0, 1, 2, 3), error=None):
    return {"pg": "0", "pg_desc": "default_pg", "seq": seq, "op": op, "state": state,
            "start_time": started, "callsite": site, "group_ranks": list(ranks), "error": error,
            "is_p2p": False}


def waiting(rank, seq=12, op="all_reduce", ranks=(0, 1, 2, 3), site="/job/train.py:47 train_step"):
    rows = (coll(seq - 1, ranks=ranks), coll(seq, op, "pending", NOW - 30, site, ranks))
    return RankState(rank, frames=(TRAIN, MAIN), collectives=rows, now=NOW)


def behind(rank, frames, ranks=(0, 1, 2, 3)):
    return RankState(rank, frames=frames, collectives=(coll(11, ranks=ranks),), now=NOW)


def test_rank_that_never_reached_the_collective_is_named_with_its_frames():
    # GIVEN three ranks waiting in all_reduce #12 and rank 2 still in its DataLoader
    loader = ({"func": "_try_get_data", "file": "/py/site-packages/torch/utils/data/dataloader.py",
               "lineno": 1291}, MAIN)
    states = [waiting(0), waiting(1), behind(2, loader), waiting(3)]
    # WHEN
    v = diagnose(states, min_wait_s=5)
    # THEN
    assert v.problem and v.culprits == [2]
    assert v.headline == ("HANG: ranks 0,1,3 wait in all_reduce #12 (group 0) for 30.0 s; "
                          "rank 2 is not in it")
    assert ("rank 2 has not reached all_reduce #12 (last done: all_reduce #11); it is in the "
            "DataLoader, waiting for a batch") in v.details
    assert "    main (train.py:90)" in v.details


def test_diverged_code_path_names_the_other_op():
    states = [waiting(0), waiting(1), waiting(2, op="broadcast", site="/job/eval.py:9 resync"),
              waiting(3)]
    v = diagnose(states)
    assert v.culprits == [2]
    assert any(d.startswith("rank 2 calls broadcast #12 instead of all_reduce (at eval.py:9 "
                            "resync)") for d in v.details)


def test_dead_and_silent_ranks_are_told_apart():
    states = [waiting(0), waiting(1), RankState(2, error="connection refused", dead=True),
              RankState(3, error="no answer in 5 s")]
    v = diagnose(states)
    assert v.culprits == [2, 3]
    text = "\n".join(render_verdict(v))
    assert "rank 2 did not answer (connection refused): the process is gone" in text
    assert "rank 3 did not answer (no answer in 5 s): alive but silent" in text


def test_failed_collective_after_a_peer_died_blames_the_peer():
    err = "RuntimeError: Connection reset by peer"
    states = [RankState(0, frames=(MAIN,), now=NOW,
                        collectives=(coll(36), coll(37, state="failed", error=err))),
              RankState(1, error="connection refused", dead=True)]
    v = diagnose(states)
    assert v.problem and v.culprits == [1]
    assert v.headline == ("PROBLEM: rank 1 did not answer; a collective failed on rank 0")
    assert any(f"rank 0: all_reduce #37 failed: {err}" in d for d in v.details)


def test_young_pending_collectives_are_not_a_hang():
    # GIVEN a healthy job: every rank is 10 ms into all_reduce #12
    states = [RankState(r, frames=(TRAIN,), now=NOW,
                        collectives=(coll(11), coll(12, state="pending", started=NOW - 0.01)))
              for r in range(4)]
    v = diagnose(states, min_wait_s=5)
    assert not v.problem
    assert v.headline.startswith("no hang")


def test_subgroup_hang_only_blames_members():
    # GIVEN ranks 0 and 1 wait in a two-rank group; 2 and 3 do other work
    states = [waiting(0, ranks=(0, 1)), behind(1, (TRAIN,), ranks=(0, 1)),
              behind(2, (MAIN,)), behind(3, (MAIN,))]
    v = diagnose(states)
    assert v.culprits == [1]
