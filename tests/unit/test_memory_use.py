"""The memory breakdown's cause, levers and doctor finding on hand-made query rows (issue 29):
estimates and their order, CUDA pressure as the only warning, a healthy job stays info."""

from __future__ import annotations

import dataclasses

import pytest

from probe_cli.diagnose.doctor import diagnose
from probe_cli.diagnose.findings import RankDoc, Report
from probe_cli.diagnose.hang import HangVerdict
from probe_cli.diagnose.memory_use import breakdown, check_memory_use, levers

NO_HANG = HangVerdict(False, "no hang")


def row(**kw: object) -> dict:
    base = {"rank": 0, "device": "cpu", "step": 40, "params_mib": 10.0, "grads_mib": 10.0,
            "optimizer_mib": 20.0, "activations_mib": 60.0, "other_mib": 300.0,
            "total_mib": 400.0, "params_fp32_mib": 10.0, "sharded": False,
            "allocated_mib": None, "reserved_mib": None, "peak_mib": None, "capacity_mib": None}
    return {**base, **kw}


def act(module: str, depth: int, saved: float, subtree: float, inputs: float, by_saved: int,
        by_ckpt: int) -> dict:
    return {"rank": 0, "module": module, "depth": depth, "saved_mib": saved,
            "share": saved / 60.0, "subtree_mib": subtree, "input_mib": inputs,
            "checkpoint_saves_mib": max(subtree - inputs, 0), "by_saved": by_saved,
            "by_checkpoint": by_ckpt}


ACTS = [act("h.1.attn", 2, 40.0, 40.0, 2.0, 1, 2), act("h.1", 1, 1.0, 50.0, 2.0, 3, 1),
        act("h.0.mlp", 2, 5.0, 5.0, 2.0, 2, 3), act("GPT", 0, 1.0, 60.0, 0.1, 4, 4)]


def test_activations_lead_to_checkpointing_the_block_around_the_attention():
    b = breakdown(0, row(), ACTS)
    assert b.cause == "activations" and b.top[0]["module"] == "h.1.attn"
    lv = levers(b, world=2)
    # THEN checkpoint first: h.1 (50 - 2); h.1.attn is inside it, h.0.mlp saves under half as
    # much (3), and the root is never proposed
    assert [x.lever for x in lv][:2] == ["checkpoint", "micro_batch"]
    assert lv[0].saves_mib == pytest.approx(48.0)
    assert "wrap h.1 in" in lv[0].action and "h.0.mlp" not in lv[0].action
    assert "GPT" not in lv[0].action
    assert lv[1].saves_mib == pytest.approx(30.0)
    shard = next(x for x in lv if x.lever == "shard_optimizer")
    assert shard.saves_mib == pytest.approx(10.0)  # 20 x (1 - 1/2)
    assert all(a.saves_mib >= c.saves_mib for a, c in zip(lv, lv[1:]))


def test_optimizer_state_first_when_it_dominates_and_ties_with_bf16():
    # Adam on an embedding, 2 ranks: shard saves 100 x 1/2 = 50, bf16 (50 + 50) / 2 = 50
    b = breakdown(0, row(params_mib=50.0, grads_mib=50.0, optimizer_mib=100.0,
                         activations_mib=1.0, params_fp32_mib=50.0), [])
    assert b.cause == "optimizer"
    lv = levers(b, world=2)
    assert lv[0].lever == "shard_optimizer" and lv[1].lever == "bf16"
    assert "optimizer state 100.0 MiB" in lv[0].basis


def test_identical_blocks_are_all_named():
    blocks = [act(f"h.{i}", 1, 0.0, 12.0, 0.5, 5 + i, 1 + i) for i in range(4)]
    lv = levers(breakdown(0, row(), blocks), world=1)
    assert lv[0].lever == "checkpoint" and lv[0].saves_mib == pytest.approx(4 * 11.5)
    assert "wrap h.0, h.1, h.2, h.3 in" in lv[0].action


def test_no_shard_lever_under_fsdp2_or_alone():
    b = breakdown(0, row(sharded=True), ACTS)
    assert "shard_optimizer" not in {x.lever for x in levers(b, world=8)}
    b = breakdown(0, row(), ACTS)
    assert "shard_optimizer" not in {x.lever for x in levers(b, world=1)}


def test_expandable_segments_when_reserved_is_far_above_allocated():
    b = breakdown(0, row(device="cuda:0", allocated_mib=20_000.0, reserved_mib=30_000.0,
                         peak_mib=29_000.0, capacity_mib=81_559.0), ACTS)
    seg = next(x for x in levers(b, 2) if x.lever == "expandable_segments")
    assert seg.saves_mib == pytest.approx(10_000.0) and "expandable_segments:True" in seg.action
    tight = breakdown(0, row(device="cuda:0", allocated_mib=20_000.0, reserved_mib=20_500.0,
                             capacity_mib=81_559.0), ACTS)
    assert "expandable_segments" not in {x.lever for x in levers(tight, 2)}


def _doc(rank: int, r: dict, acts: list) -> RankDoc:
    return RankDoc(rank, breakdown=[{**r, "rank": rank}],
                   activations=[{**a, "rank": rank} for a in acts])


def test_doctor_warns_only_under_cuda_pressure():
    # GIVEN two CUDA ranks at 95% of the device
    hot = row(device="cuda:0", allocated_mib=70_000.0, reserved_mib=76_000.0,
              peak_mib=77_500.0, capacity_mib=81_559.0)
    report = Report()
    check_memory_use(report, [_doc(0, hot, ACTS), _doc(1, hot, ACTS)])
    [f] = report.findings
    assert f.severity == "warning" and f.check == "memory_use"
    assert f.title.startswith("MEMORY PRESSURE: rank 0 cuda:0 at 95%")
    assert "h.1.attn saves 67%" in f.title and "first lever: checkpoint" in f.title
    assert f.detail["cause"] == "activations"
    assert f.detail["levers"][0]["lever"] == "checkpoint"
    # AND with ample headroom, or on CPU, the same numbers are information
    roomy = row(device="cuda:0", allocated_mib=7_000.0, reserved_mib=7_600.0,
                peak_mib=7_750.0, capacity_mib=81_559.0)
    for r in (roomy, row()):
        report = Report()
        check_memory_use(report, [_doc(0, r, ACTS)])
        assert [f.severity for f in report.findings] == ["info"]


def test_doctor_says_unchecked_before_a_traced_step_and_nothing_for_older_agents():
    report = Report()
    check_memory_use(report, [RankDoc(0, breakdown=[])])
    assert not report.findings and "no traced step counted yet" in report.unchecked[0]
    report = Report()
    check_memory_use(report, [RankDoc(0)])
    assert not report.findings and not report.unchecked


def test_a_healthy_job_stays_without_a_problem():
    docs = [dataclasses.replace(_doc(r, row(), ACTS)) for r in (0, 1)]
    report = diagnose(NO_HANG, docs, 5.0)
    mem = [f for f in report.findings if f.check == "memory_use"]
    assert mem and mem[0].severity == "info" and not report.problem


def test_a_large_job_s_finding_stays_small():
    # GIVEN 300 ranks, one of them at 95% of its device
    hot = row(device="cuda:0", allocated_mib=70_000.0, reserved_mib=76_000.0,
              peak_mib=77_500.0, capacity_mib=81_559.0)
    cool = row(device="cuda:0", allocated_mib=7_000.0, reserved_mib=7_600.0,
               peak_mib=7_750.0, capacity_mib=81_559.0)
    docs = [_doc(r, hot if r == 217 else cool, ACTS) for r in range(300)]
    report = Report()
    check_memory_use(report, docs)
    [f] = report.findings
    # THEN it names the hot rank, carries the worst ranks only, and counts the rest
    assert f.ranks == [217] and f.detail["breakdown"][0]["rank"] == 217
    assert len(f.detail["breakdown"]) == 128 and f.detail["ranks_counted"] == 300
    assert sum(line.startswith("rank ") for line in f.evidence) == 8
    assert "292 more ranks" in "\n".join(f.evidence)


def test_the_text_uses_the_exact_bytes_not_the_rounded_mib():
    # 248024 B of parameters (a 242 KiB CNN): params_mib is rounded to 0.24 -> "246 KiB"
    b = breakdown(0, row(params_mib=0.24, params_bytes=248024, grads_mib=0.0, grads_bytes=0),
                  [])
    text = b.kinds_text()
    assert "parameters 242 KiB" in text and "gradients 0 KiB" in text, text
    # an older agent's row without the bytes still reads its MiB
    assert "parameters 10.0 MiB" in breakdown(0, row(), []).kinds_text()
