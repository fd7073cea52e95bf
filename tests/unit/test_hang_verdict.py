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
    # the culprit first, then who waits for it and how long
    assert v.headline == ("HANG: rank 2 never reached all_reduce #12; it is in the DataLoader, "
                          "waiting for a batch. 3 ranks wait for it, for 30.0 s")
    assert ("rank 2 never reached all_reduce #12; it is in the DataLoader, waiting for a batch "
            "(last done: all_reduce #11)") in v.details
    assert "    main (train.py:90)" in v.details


def test_diverged_code_path_names_the_other_op():
    states = [waiting(0), waiting(1), waiting(2, op="broadcast", site="/job/eval.py:9 resync"),
              waiting(3)]
    v = diagnose(states)
    assert v.culprits == [2]
    assert v.headline.startswith("HANG: rank 2 calls broadcast #12 where the others call "
                                 "all_reduce (at eval.py:9 resync): the code paths diverged")


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
    assert v.headline == ("PROBLEM: rank 1 did not answer (connection refused): the process is "
                          "gone; a collective failed on rank 0")
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


def history(rank, gap, n=30, pending_age=None):
    """``n`` done collectives ``gap`` s apart, then one pending for ``pending_age`` s."""
    rows = [coll(i, started=NOW - (n - i) * gap, ranks=(0, 1)) for i in range(n)]
    if pending_age is not None:
        rows.append(coll(n, state="pending", started=NOW - pending_age, ranks=(0, 1)))
    return RankState(rank, frames=(TRAIN, MAIN), collectives=tuple(rows), now=NOW)


def test_long_steps_are_not_a_hang_but_a_stop_in_a_fast_job_is():
    # GIVEN a job whose collectives start every 8 s: rank 0 has waited 7 s (rank 1 computes)
    slow = [history(0, 8.0, pending_age=7.0), history(1, 8.0)]
    # WHEN diagnosed with the job's own rhythm (no fixed threshold)
    v = diagnose(slow)
    # THEN no hang: 7 s is less than 4 normal gaps
    assert not v.problem and v.threshold_s == 32.0, v.headline
    # GIVEN a job with 1 s gaps whose rank 1 stopped 6 s ago
    fast = [history(0, 1.0, pending_age=6.0), history(1, 1.0)]
    v = diagnose(fast)
    # THEN a hang, named after a few step times, with its confidence and basis
    assert v.problem and v.culprits == [1] and v.threshold_s == 4.0
    assert v.confidence in ("medium", "high")
    assert "90th percentile of" in v.basis and "waited 6.0 s" in v.basis
    assert v.to_json()["confidence"] == v.confidence


def test_gil_held_culprit_shows_its_stack_read_from_outside():
    # GIVEN rank 0 waits; rank 1's backtrace came from its watchdog, its collectives timed out
    spin = {"func": "spin_in_c", "file": "/job/train.py", "lineno": 101}
    states = [history(0, 1.0, pending_age=12.0),
              RankState(1, frames=(spin, MAIN), coll_error="HTTP 504", route="py-spy")]
    v = diagnose(states)
    assert v.headline == ("HANG: rank 1 never reached all_reduce #30; it is in spin_in_c "
                          "(train.py:101). 1 rank waits for it, for 12.0 s")
    assert any("the stack was read from outside the process (py-spy)" in d for d in v.details)
    assert "    spin_in_c (train.py:101)" in v.details


def test_a_gil_held_rank_is_named_before_the_wait_is_long():
    # GIVEN rank 0 only 1 s into all_reduce #30, and rank 1 whose Python does not run
    spin = {"func": "spin_in_c", "file": "/job/train.py", "lineno": 101}
    states = [history(0, 1.0, pending_age=1.0),
              RankState(1, frames=(spin, MAIN), coll_error="HTTP 504", route="py-spy")]
    v = diagnose(states)
    # THEN the hang is named now, culprit first, on the evidence of the held GIL
    assert v.headline.startswith("HANG: rank 1 never reached all_reduce #30; it is in spin_in_c")
    assert "GIL is held" in v.basis and v.confidence == "high"


def test_a_busy_node_heartbeat_short_of_the_jobs_threshold_is_no_held_gil():
    # GIVEN rank 0 0.2 s into all_reduce #30 (a 1 s rhythm: stuck means 4 s), and rank 1 whose
    # collectives read got the watchdog's 504 after its Python had not run for 1.1 s (2
    # overloaded cores: the healthy DataLoader job of the fault suite)
    spin = {"func": "main", "file": "/job/train.py", "lineno": 155}
    busy = RankState(1, frames=(spin,), coll_error="HTTP 504", route="py-spy", gil_age_s=1.1)
    v = diagnose([history(0, 1.0, pending_age=0.2), busy])
    # THEN no hang (it was "HANG: rank 1 never reached all_reduce #30 ... for 0.2 s")
    assert not v.problem, v.headline
    # AND once its Python has not run for longer than the job's threshold, it is named
    held = RankState(1, frames=(spin,), coll_error="HTTP 504", route="py-spy", gil_age_s=6.0)
    v = diagnose([history(0, 1.0, pending_age=0.2), held])
    assert v.problem and v.culprits == [1], v.headline
