"""The precise levers on hand-made query rows (probe_cli/diagnose/levers.py, lever_checks.py,
rank_work.py): host syncs named at their line and quiet when few, small ops only when the ops
are many and small, torch.compile and graph breaks, host work inside one module, MoE
imbalance by layer and expert, and why a straggler is slower."""

from __future__ import annotations

from probe_cli.diagnose.findings import RankDoc, Report
from probe_cli.diagnose.lever_checks import check_host_syncs, check_moe
from probe_cli.diagnose.rank_work import held_tokens, why_slower
from probe_cli.diagnose.straggler import diagnose_stragglers
from probe_cli.diagnose.throughput import check_throughput
from tests.unit.test_throughput_lever import row


def syncs(per_step: float, calls: float, kind: str = "item") -> list[dict]:
    return [{"rank": 0, "steps": 49, "syncs_per_step": per_step, "max_per_step": per_step,
             "sync_ms_per_step": 1.2, "kind": kind, "file": "/src/train.py", "line": 248,
             "func": "main", "calls_per_step": calls, "in_steps": 49}]


def flops(ops: int, module_rows: list[dict] | None = None) -> list[dict]:
    rows = module_rows or [{"module": None, "flops": 1e9, "ops": ops, "op_ms": 5.0}]
    total = sum(r["flops"] for r in rows)
    return [{**r, "all_flops": total, "all_ops": ops, "all_op_ms": 5.0} for r in rows]


def doc(**kw: object) -> RankDoc:
    d = RankDoc(0, throughput=[row(**kw.pop("tp", {}))])  # type: ignore[arg-type]
    for k, v in kw.items():
        d.file(k, v)  # type: ignore[arg-type]
    return d


def test_many_item_calls_are_the_lever_at_their_line():
    # GIVEN 806 .item() per step at train.py:248 and host code the largest share
    d = doc(tp={"host_share": 0.45, "forward_share": 0.2, "backward_share": 0.3},
            host_syncs=syncs(806, 806))
    report = Report()
    check_throughput(report, [d])
    check_host_syncs(report, [d])
    # THEN one finding: the throughput lever is the syncs, named with the line and the remedy
    [f] = report.findings
    assert f.detail["lever"] == "host_syncs"
    assert f.title == "LOW THROUGHPUT: host syncs: 806 .item() per step at train.py:248"
    assert "accumulate" not in f.evidence[0] and "loss.detach()" in f.evidence[0]
    assert "the throughput finding's lever" in report.fine[-1]


def test_many_syncs_are_named_even_when_another_lever_wins():
    d = doc(tp={"input_share": 0.6, "forward_share": 0.1, "backward_share": 0.2},
            host_syncs=syncs(300, 300, "tolist"))
    report = Report()
    check_throughput(report, [d])
    check_host_syncs(report, [d])
    checks = {f.check: f for f in report.findings}
    assert checks["throughput"].detail["lever"] == "input"
    assert checks["host_syncs"].title.startswith("HOST SYNCS: 300 .tolist() per step at "
                                                 "train.py:248")
    assert any("/src/train.py:248 in main" in e for e in checks["host_syncs"].evidence)


def test_a_few_syncs_a_step_get_nothing():
    # a healthy loop: loss.item() once a step, and compute dominates
    d = doc(host_syncs=syncs(1, 1), module_flops=flops(40))
    report = Report()
    check_throughput(report, [d])
    check_host_syncs(report, [d])
    assert report.findings == []
    assert "host syncs: at most 1 per step" in report.fine


def test_low_flops_in_few_large_ops_is_not_small_ops():
    # GIVEN compute far below the peak (a toy model on a big CPU) but only 40 ops of 2 ms
    d = doc(tp={"compute_flops_per_s": 1e8}, module_flops=flops(40))
    report = Report()
    check_throughput(report, [d])
    # THEN no "host-bound (small ops)": the false alarm of healthy jobs
    assert report.findings == [], report.findings


def test_small_ops_compiled_with_graph_breaks_names_the_breaks():
    d = doc(tp={"compute_flops_per_s": 1e8, "step_ms": 80.0}, module_flops=flops(1500),
            compile=[{"dynamo": True, "frames": 9, "graphs": 7, "graph_breaks": 6,
                      "top_break": "Unsupported Tensor.item() call", "recompiles": 0,
                      "compiled_root": True, "compiled_modules": None}])
    report = Report()
    check_throughput(report, [d])
    [f] = report.findings
    assert f.detail["lever"] == "graph_breaks" and "6 graph breaks" in f.evidence[0]
    assert "Unsupported Tensor.item() call" in f.evidence[0]
    assert f.next.startswith("TORCH_LOGS=graph_breaks")


def test_a_module_with_the_time_and_no_flops_is_the_bottleneck():
    # GIVEN module "1" takes 20 ms of a 40 ms step in its own forward, with no FLOPs
    slow = [{"module": "1", "fwd_self_ms": 20.0, "bwd_self_ms": 0.1, "self_ms": 20.1,
             "pct": 59.0}, {"module": "0", "fwd_self_ms": 1.0, "bwd_self_ms": 2.0,
                            "self_ms": 3.0, "pct": 9.0}]
    mf = flops(30, [{"module": "0", "flops": 5e8, "ops": 3, "op_ms": 0.8},
                    {"module": "1.fc", "flops": 5e8, "ops": 3, "op_ms": 0.8},
                    {"module": None, "flops": 1e9, "ops": 24, "op_ms": 2.0}])
    d = doc(tp={"step_ms": 40.0, "compute_flops_per_s": 1e8}, slow=slow, module_flops=mf)
    report = Report()
    check_throughput(report, [d])
    [f] = report.findings
    assert f.detail["lever"] == "module_host"
    assert f.title == ("LOW THROUGHPUT: bottleneck: 1: 20 ms per step with no tensor work: "
                       "host code in its forward")


def test_a_slow_module_that_computes_is_no_bottleneck():
    slow = [{"module": "attn", "fwd_self_ms": 20.0, "self_ms": 30.0, "pct": 60.0}]
    mf = flops(30, [{"module": "attn", "flops": 8e8, "ops": 10, "op_ms": 18.0},
                    {"module": None, "flops": 2e8, "ops": 20, "op_ms": 5.0}])
    d = doc(tp={"step_ms": 40.0}, slow=slow, module_flops=mf)
    report = Report()
    check_throughput(report, [d])
    assert report.findings == []


def moe_rows(layer: str, tokens: list[int], steps: int = 4) -> list[dict]:
    return [{"rank": 0, "layer": layer, "expert": e, "tokens": t, "steps": steps,
             "experts": len(tokens), "top_k": 1} for e, t in enumerate(tokens)]


def test_moe_names_the_layer_and_expert():
    d = RankDoc(0, answers={"moe": moe_rows("blocks.0.mlp", [250, 260, 240, 250])
                            + moe_rows("blocks.1.mlp", [910, 90, 0, 0])})
    report = Report()
    check_moe(report, [d])
    [f] = report.findings
    assert f.severity == "warning" and f.check == "moe"
    assert f.title == ("MOE IMBALANCE: blocks.1.mlp: expert 0 gets 91% of tokens, experts 2-3 "
                       "none (max-to-ideal 3.6x)")


def test_with_expert_parallelism_the_rank_holding_the_busy_expert_is_named():
    # GIVEN 2 ranks, each holding 2 of 4 experts, both routers sending ~90% to expert 0
    def ep(rank: int, tokens: list[int]) -> list[dict]:
        return [{**r, "rank": rank, "owner": r["expert"] // 2}
                for r in moe_rows("blocks.0", tokens)]

    a2a = [{"op": "all_to_all_single", "duration": 0.01}] * 10
    docs = [RankDoc(0, answers={"moe": ep(0, [900, 50, 30, 20])}, collectives=tuple(a2a[:2])),
            RankDoc(1, answers={"moe": ep(1, [880, 60, 40, 20])}, collectives=tuple(a2a))]
    report = Report()
    check_moe(report, docs)
    [f] = report.findings
    # THEN the title names rank 0 (it holds expert 0) and the share of all tokens it computes
    assert f.title.endswith("; rank 0 holds it and computes 94% of the layer's tokens (an "
                            "even share is 50%)"), f.title
    assert f.detail["holder"] == 0 and f.ranks == [0, 1]
    # AND the evidence says who holds what, and whose all-to-all wait is for whom
    assert ("expert parallelism (blocks.0): rank 0 holds experts 0-1 and computes 1890 of the "
            "2000 tokens every rank's router sent (94%)") in f.evidence
    assert ("rank 1: 10 all-to-all calls, 0.100 s in them (its wait here is for rank 0, which "
            "holds the busy expert)") in f.evidence
    # AND when the holder itself spent longer in all-to-all, no wait is blamed on it
    docs[0].collectives = tuple(a2a * 2)
    report = Report()
    check_moe(report, docs)
    [f] = report.findings
    assert "rank 0: 20 all-to-all calls, 0.200 s in them" in f.evidence
    assert not any("wait" in e and "for rank 0" in e for e in f.evidence[:-2]), f.evidence
    assert ("the all-to-all times do not show rank 0's peers waiting for it in this window (its "
            "extra expert compute is small beside the step)") in f.evidence


def test_without_expert_parallelism_no_rank_is_named():
    # GIVEN the same skew with every expert on every rank (owner NULL: no EP)
    docs = [RankDoc(r, answers={"moe": [{**x, "rank": r, "owner": None}
                                        for x in moe_rows("blocks.0", [900, 50, 30, 20])]})
            for r in (0, 1)]
    report = Report()
    check_moe(report, docs)
    [f] = report.findings
    assert "holds it" not in f.title and f.detail["holder"] is None
    assert not any("expert parallelism" in e for e in f.evidence)


def test_a_balanced_moe_gets_nothing():
    d = RankDoc(0, answers={"moe": moe_rows("blocks.0.mlp", [250, 300, 200, 250])})
    report = Report()
    check_moe(report, [d])
    assert report.findings == [] and "within 1.2x" in report.fine[-1]


def test_with_expert_parallelism_the_straggler_holds_the_busy_experts():
    # GIVEN both ranks' routers sending most tokens to the experts rank 0 holds
    rows = [{"rank": src, "layer": "blocks.0", "expert": e, "tokens": t, "owner": e // 2}
            for src in (0, 1) for e, t in enumerate([900, 50, 30, 20])]
    held = held_tokens(rows)
    assert held == {0: 1900, 1: 100}
    # THEN the straggler's why says rank 0 computes 19x the others' MoE tokens
    work = {r: {"samples": 64, "moe_tokens": t} for r, t in held.items()}
    assert why_slower(0, work) == ["it holds the busy experts: it computes 19.0x the others' "
                                   "MoE tokens (1900 vs 100 over the sampled steps)"]
    # AND without expert parallelism (no owner) there is no such reason
    assert held_tokens([{**r, "owner": None} for r in rows]) == {}


def test_why_the_straggler_is_slower():
    work = {0: {"samples": 16, "tokens": 2048, "data_wait_ms": 0.4, "syncs_per_step": 1},
            1: {"samples": 48, "tokens": 6144, "data_wait_ms": 0.5, "syncs_per_step": 1},
            2: {"samples": 16, "tokens": 2048, "data_wait_ms": 0.3, "syncs_per_step": 2}}
    why = why_slower(1, work)
    assert why[0] == "its batch is 3.0x the others' (48 vs 16 samples per step)"
    assert len(why) == 2  # and tokens; DataLoader wait and syncs are no reason
    assert why_slower(0, work) == []


def test_the_straggler_headline_says_why():
    # rank 1 arrives 30 ms late at every one of 40 all-reduces, 100 ms apart
    rows = {r: [{"pg": "0", "seq": i, "op": "all_reduce", "start_time": i * 0.1 + (0.03 if r
                 else 0.0), "duration": 0.001} for i in range(40)] for r in (0, 1)}
    work = {0: {"samples": 16}, 1: {"samples": 48}}
    v = diagnose_stragglers(rows, last=40, step_s=0.1, work=work)
    assert v.problem and v.culprits == [1], v.headline
    assert v.headline.endswith("; why: its batch is 3.0x the others' (48 vs 16 samples per "
                               "step)")


def test_a_waiting_module_beats_the_host_remainder_it_is_larger_than():
    # host outside modules 40% (DDP's wait, gaps), but one module waits 50% of the step
    slow = [{"module": "1", "fwd_self_ms": 20.0, "self_ms": 20.0, "pct": 90.0}]
    mf = flops(30, [{"module": "0", "flops": 1e9, "ops": 30, "op_ms": 1.0}])
    d = doc(tp={"step_ms": 40.0, "host_share": 0.4, "forward_share": 0.5,
                "backward_share": 0.05}, slow=slow, module_flops=mf)
    report = Report()
    check_throughput(report, [d])
    assert report.findings[0].detail["lever"] == "module_host"


def test_small_ops_beat_a_smaller_host_remainder():
    d = doc(tp={"compute_flops_per_s": 1e8, "step_ms": 80.0, "host_share": 0.35,
                "forward_share": 0.3, "backward_share": 0.3}, module_flops=flops(1500))
    report = Report()
    check_throughput(report, [d])
    assert report.findings[0].detail["lever"] == "small_ops"
    # ...and lose to a larger one
    d = doc(tp={"compute_flops_per_s": 1e8, "step_ms": 80.0, "host_share": 0.6,
                "forward_share": 0.2, "backward_share": 0.15}, module_flops=flops(1500))
    report = Report()
    check_throughput(report, [d])
    assert report.findings[0].detail["lever"] == "host"
