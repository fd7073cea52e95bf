"""How a dead job's ranks ended, cause first (diagnose/ends.py, pure): a rank SIGKILLed (the OOM
killer, a user's kill -9) leads over the survivor whose collective then failed with "Connection
reset by peer", though the killed rank's death is seen later (by its watchdog)."""

from __future__ import annotations

from types import SimpleNamespace

from probe_cli.diagnose.ends import check_ends, ends_lines, survivors_line, went_wrong
from probe_cli.diagnose.findings import CRITICAL, Finding, Report

RESET = ("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:30622: Connection reset by "
         "peer. This is typically caused by a remote worker hanging")


def _rank(rank: int, end: dict, death: dict) -> SimpleNamespace:
    return SimpleNamespace(rank=rank, end=end, death=death, meta={"step": 1600},
                           copied_at=1000.0)


def _job(*ranks: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(job="j", label="/tmp/pm/j", ranks={r.rank: r for r in ranks},
                           missing=[], world_size=len(ranks))


def _lightning_kill() -> SimpleNamespace:
    # litgpt pretrain (Lightning's launcher), rank 1 SIGKILLed: rank 0's all_reduce raised at
    # 16:19:59.0, rank 1's watchdog saw its death a moment later
    survivor = _rank(0, {"kind": "exception", "exception": f"RuntimeError: {RESET}",
                         "at": 1000.0}, {})
    killed = _rank(1, {}, {"at": 1000.4, "exit": {"signal": 9, "signal_name": "SIGKILL",
                                                   "description": "killed by signal 9 (SIGKILL)"}})
    return _job(survivor, killed)


def test_a_killed_rank_leads_over_the_survivor_that_lost_its_peer():
    job = _lightning_kill()
    assert [r.rank for r in went_wrong(job)] == [1, 0]
    lines = ends_lines(job)
    # (its step is its last copy's: a SIGKILL leaves no copy at the death)
    assert lines[1].startswith("  rank 1: killed by signal 9 (SIGKILL)")
    assert lines[1].endswith(", last copied at step 1600") and lines[2].endswith(", step 1600")
    # GIVEN the hang check's verdict on the survivors' failed collective
    report = Report()
    report.findings.append(Finding(CRITICAL, "hang", "PROBLEM: a collective failed on rank 0",
                                   ["rank 0: all_reduce #4852 failed"], "probe hang", [0],
                                   score=1e9))
    check_ends(report, job)
    top, hang, survivor = report.ranked()
    # THEN the killed rank is the first finding, and the others say it is whose death they saw
    assert top.title == "rank 1 died: killed by signal 9 (SIGKILL)"
    assert hang.check == "hang" and hang.evidence[0].startswith("rank 1 died first")
    assert survivor.ranks == [0] and survivor.evidence[0].startswith("lost its peer: rank 1")
    # AND `probe hang` on the copy prints the same line under its verdict blaming rank 0
    assert survivors_line(job, [0]) == hang.evidence[0]
    assert survivors_line(job, [1]) is None  # a verdict blaming the killed rank needs none


def test_an_exception_of_its_own_still_leads_by_time():
    # two ranks dying of their own errors: first to go wrong first, no "lost its peer"
    a = _rank(0, {"kind": "exception", "exception": "ValueError: bad batch", "at": 1000.0}, {})
    b = _rank(1, {"kind": "exception", "exception": "KeyError: 'x'", "at": 1001.0}, {})
    report = Report()
    check_ends(report, _job(a, b))
    assert [f.ranks for f in report.ranked()] == [[0], [1]]
    assert not any("lost its peer" in e for f in report.findings for e in f.evidence)
    # a launcher's SIGTERM is not a death of its own
    term = _rank(1, {"kind": "signal", "signal_name": "SIGTERM", "at": 1001.0},
                 {"exit": {"signal": 15}})
    assert [r.rank for r in went_wrong(_job(a, term))] == [0]
