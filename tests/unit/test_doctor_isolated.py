"""Doctor's "ranks never communicate" finding on hand-made answers (a 2-rank job whose model is
never wrapped in DDP: pytorch/examples' imagenet on CPU), and its silence on a DDP job."""

from __future__ import annotations

from probe_cli.diagnose.doctor import diagnose
from probe_cli.diagnose.findings import RankDoc
from probe_cli.diagnose.hang import HangVerdict

NO_HANG = HangVerdict(False, "no hang")


def _doc(rank: int, collectives: int, steps: int, framework: str | None = None) -> RankDoc:
    doc = RankDoc(rank, state={"now": 1000.0, "clock": {"step": steps,
                                                        "last_step_at": 999.9}})
    doc.file("comm", [{"collectives": collectives, "steps": steps, "last_step": steps,
                       "framework": framework}])
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


def test_an_hf_trainer_that_is_not_distributed_is_told_to_fix_its_arguments_not_wrap_in_ddp():
    # run_clm.py under torchrun on CPU without --use_cpu: accelerate leaves the Trainer
    # undistributed ("distributed training: False"), each rank trains alone; wrapping the model
    # in DDP by hand is not the fix, the Trainer's arguments are
    report = diagnose(NO_HANG, [_doc(0, 0, 80, "hf_trainer"), _doc(1, 0, 79, "hf_trainer")], 5.0)
    [f] = _isolated(report)
    assert "--use_cpu" in f.next and "DistributedDataParallel(model)" not in f.next
    assert any("HF Trainer" in e for e in f.evidence)


def test_ddp_ranks_and_young_jobs_and_single_ranks_are_not_flagged():
    # a DDP job: the Flight Recorder's all-reduces are counted
    assert not _isolated(diagnose(NO_HANG, [_doc(0, 360, 180), _doc(1, 360, 180)], 5.0))
    # too few steps to judge: said, not flagged
    young = diagnose(NO_HANG, [_doc(0, 0, 5), _doc(1, 0, 5)], 5.0)
    assert not _isolated(young)
    assert any(u.startswith("ranks communicating: no collective yet") for u in young.unchecked)
    # one process: nothing to communicate with
    assert not _isolated(diagnose(NO_HANG, [_doc(0, 0, 500)], 5.0))


def test_ranks_that_never_communicate_are_not_counted_as_data_parallel():
    from probe_cli.diagnose.isolated import not_data_parallel
    from probe_cli.diagnose.throughput import from_rows

    alone = {0: {"collectives": 0, "steps": 180}, 1: {"collectives": 0, "steps": 180}}
    why = not_data_parallel(alone)
    assert why is not None and "0 collectives in 180 steps" in why
    # GIVEN 2 ranks of 256 tokens a step each that never communicate
    tput = {r: {"tokens": 256, "steps": 10} for r in (0, 1)}
    j = from_rows(tput, 2, isolated=why)[1].to_json()
    # THEN one replica: GB_tok is one rank's tokens, and the output says why
    assert (j["dp_world"], j["gb_tok"]) == (1, 256) and j["dp_source"] == why
    # (a DDP job, or one rank's answer missing: counted as before)
    ddp = {0: {"collectives": 360, "steps": 180}, 1: {"collectives": 360, "steps": 180}}
    assert not_data_parallel(ddp) is None and not_data_parallel({**alone, 1: None}) is None
    assert from_rows(tput, 2, isolated=None)[1].to_json()["gb_tok"] == 512
    # AND doctor's memory finding has no optimizer-sharding lever for them, and says why
    docs = [_doc(r, 0, 180) for r in (0, 1)]
    for d in docs:
        d.breakdown = [{"rank": d.rank, "device": "cpu", "step": 40, "params_mib": 10.0,
                        "grads_mib": 10.0, "optimizer_mib": 20.0, "activations_mib": 1.0,
                        "other_mib": 300.0, "total_mib": 341.0, "params_fp32_mib": 10.0,
                        "sharded": False}]
    report = diagnose(NO_HANG, docs, 5.0)
    [mem] = [f for f in report.findings if f.check == "memory_use"]
    assert all(lv["lever"] != "shard_optimizer" for lv in mem.detail["levers"])
    assert any(e.startswith("no optimizer sharding lever: not data-parallel") for e in mem.evidence)
    # (the same ranks, communicating: the lever is there)
    for d in docs:
        d.file("comm", [{"collectives": 360, "steps": 180, "last_step": 180}])
    report = diagnose(NO_HANG, docs, 5.0)
    [mem] = [f for f in report.findings if f.check == "memory_use"]
    assert any(lv["lever"] == "shard_optimizer" for lv in mem.detail["levers"])
