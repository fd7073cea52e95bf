"""Doctor's "ranks never communicate" finding on hand-made answers (a 2-rank job whose model is
never wrapped in DDP: pytorch/examples' imagenet on CPU), and its silence on a DDP job."""

from __future__ import annotations

from probe_cli.diagnose.doctor import diagnose
from probe_cli.diagnose.findings import RankDoc
from probe_cli.diagnose.hang import HangVerdict

NO_HANG = HangVerdict(False, "no hang")


def _doc(rank: int, collectives: int, steps: int) -> RankDoc:
    doc = RankDoc(rank, state={"now": 1000.0, "clock": {"step": steps,
                                                        "last_step_at": 999.9}})
    doc.file("comm", [{"collectives": collectives, "steps": steps, "last_step": steps}])
    return doc


def _isolated(report) -> list:
    return [f for f in report.findings if f.check == "isolated"]


def test_two_ranks_without_a_collective_in_180_steps_is_a_finding():
    report = diagnose(NO_HANG, [_doc(0, 0, 180), _doc(1, 0, 180)], 5.0)
    [f] = _isolated(report)
    assert f.severity == "warning" and f.ranks == [0, 1]
    assert f.title.startswith("RANKS NEVER COMMUNICATE: 2 ranks, 0 collectives in 180 steps")
    assert "DistributedDataParallel" in f.next
    assert any("not data-parallel" in e for e in f.evidence)


def test_ddp_ranks_and_young_jobs_and_single_ranks_are_not_flagged():
    # a DDP job: the Flight Recorder's all-reduces are counted
    assert not _isolated(diagnose(NO_HANG, [_doc(0, 360, 180), _doc(1, 360, 180)], 5.0))
    # too few steps to judge: said, not flagged
    young = diagnose(NO_HANG, [_doc(0, 0, 5), _doc(1, 0, 5)], 5.0)
    assert not _isolated(young)
    assert any(u.startswith("ranks communicating: no collective yet") for u in young.unchecked)
    # one process: nothing to communicate with
    assert not _isolated(diagnose(NO_HANG, [_doc(0, 0, 500)], 5.0))
