"""`probe throughput`'s lever, the job's GB_tok and doctor's LOW THROUGHPUT finding on hand-made
throughput rows; the peak table by device name and dtype."""

from __future__ import annotations

import pytest

from probe_agent.collectors.peak import table_peak
from probe_cli.diagnose.findings import Finding, RankDoc, Report
from probe_cli.diagnose.throughput import check_throughput, from_rows


def row(**kw: object) -> dict:
    base = {"rank": 0, "steps": 50, "last_step": 100, "step_ms": 100.0, "tokens": 256,
            "samples": 8, "micro_batches": 2, "context_len": 32, "tokens_per_s": 2560.0,
            "samples_per_s": 80.0, "flops": 1e9, "flops_per_s": 1e10, "peak_flops": 2e10,
            "peak_source": "measured: CPU float32 matmul, 1 threads", "traced_steps": 5,
            "forward_share": 0.3, "backward_share": 0.55, "optimizer_share": 0.05,
            "input_share": 0.02, "collective_share": 0.0, "host_share": 0.08,
            "compute_flops_per_s": 1.2e10}
    return {**base, **kw}


def docs(*rows: dict) -> list[RankDoc]:
    return [RankDoc(i, throughput=[{**r, "rank": i}]) for i, r in enumerate(rows)]


def test_compute_bound_job_has_no_lever_and_no_finding():
    # GIVEN two ranks whose compute is 90% of the step, MFU 50%
    report = Report()
    check_throughput(report, docs(row(), row()))
    # THEN doctor stays quiet and says so
    assert report.findings == []
    assert report.fine and "compute dominates" in report.fine[0] and "rank 0 50%" in report.fine[0]


@pytest.mark.parametrize("shares,lever,label", [
    ({"input_share": 0.6, "forward_share": 0.1, "backward_share": 0.2}, "input", "input-bound"),
    ({"collective_share": 0.5, "forward_share": 0.1, "backward_share": 0.3}, "collective",
     "communication-bound"),
    ({"host_share": 0.45, "forward_share": 0.2, "backward_share": 0.3}, "host", "host-bound"),
], ids=["input", "collective", "host"])
def test_the_largest_non_compute_share_is_the_lever(shares, lever, label):
    report = Report()
    check_throughput(report, docs(row(**shares), row(**shares)))
    [f] = report.findings
    assert f.check == "throughput" and f.severity == "info"
    assert f.detail["lever"] == lever and label in f.title and f.ranks == [0, 1]
    assert f.next.startswith("probe ")


def test_compute_far_below_the_peak_is_small_ops():
    # GIVEN compute dominates but runs at 0.5% of the peak, in 1,200 ops of ~70 us or less
    # (many tiny modules; the measured step's module_flops rows count them)
    report = Report()
    [d] = docs(row(compute_flops_per_s=1e8, step_ms=80.0))
    d.file("module_flops", [{"module": None, "flops": 1e9, "ops": 1200, "op_ms": 50.0,
                       "all_flops": 1e9, "all_ops": 1200, "all_op_ms": 50.0}])
    check_throughput(report, [d])
    [f] = report.findings
    assert f.detail["lever"] == "small_ops" and "0.5% of the peak" in f.evidence[0]
    assert "1200 ops" in f.evidence[0] and "not compiled" in f.evidence[0]
    assert f.next.startswith("model = torch.compile(model)")


def test_a_lever_with_its_own_finding_is_not_reported_twice():
    report = Report(findings=[Finding("warning", "dataloader", "DATA-BOUND")])
    check_throughput(report, docs(row(input_share=0.6)))
    assert [f.check for f in report.findings] == ["dataloader"]
    assert "the dataloader finding" in report.fine[-1]


def test_too_few_traced_steps_name_no_lever():
    ranks, _ = from_rows({0: row(traced_steps=1, input_share=0.9)}, 1)
    assert ranks[0].lever() is None


def test_gb_tok_and_peak_override():
    # GIVEN 4 DP ranks of which 3 answered, 256 tokens each per step
    ranks, job = from_rows({0: row(), 1: row(), 2: row()}, 4, peak_tflops=0.1)
    j = job.to_json()
    assert j["gb_tok"] == 4 * 256 and j["micro_batch"] == 4 and j["accumulation"] == 2
    assert j["dp_world"] == 4 and j["context_len"] == 32
    assert ranks[0].mfu == pytest.approx(1e10 / 1e11) and ranks[0].peak_source == "--peak-tflops"


@pytest.mark.parametrize("name,dtype,tflops", [
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989.4), ("NVIDIA H100 PCIe", "bfloat16", 756.5),
    ("NVIDIA H200", "float16", 989.4), ("NVIDIA A100-SXM4-80GB", "tf32", 156),
    ("NVIDIA L40S", "bfloat16", 362.05), ("AMD Instinct MI300X", "bfloat16", 1307.4),
])
def test_peak_table_by_device_and_dtype(name, dtype, tflops):
    flops, source = table_peak(name, dtype)
    assert flops == pytest.approx(tflops * 1e12) and "data sheet" in source


def test_unknown_device_or_dtype_has_no_peak():
    assert table_peak("Some Future GPU", "bfloat16") is None
    assert table_peak("NVIDIA V100", "bfloat16") is None


def test_tensor_and_pipeline_groups_count_a_replica_once_and_none_says_assumed():
    # GIVEN 8 ranks in a mesh dp=2, tp=2, pp=2; each rank of a replica reports its 256 tokens
    rows = {i: row() for i in range(8)}
    lay = {"source": "DeviceMesh", "mesh": "dp=2, pp=2, tp=2", "tp": 2, "pp": 2, "world": 8}
    _, job = from_rows(rows, 8, layout=lay)
    j = job.to_json()
    # THEN the data-parallel world is 8 / (2 x 2) and GB_tok counts each replica once
    assert (j["dp_world"], j["tp"], j["pp"], j["gb_tok"]) == (2, 2, 2, 512)
    assert j["dp_source"] == "DeviceMesh: dp=2, pp=2, tp=2"
    # AND without a layout every rank reached is data parallel, and the output says so
    j = from_rows(rows, 8)[1].to_json()
    assert (j["dp_world"], j["gb_tok"]) == (8, 8 * 256)
    assert j["dp_source"].startswith("assumed = ranks reached")


def test_a_checkpoint_pause_is_the_lever_against_the_steps_it_leaves():
    # GIVEN a compute-bound job whose checkpoint saves take 15% of the wall time (5 steps of 50)
    ranks, _ = from_rows({0: row(checkpoint_share=0.15, eval_share=0.0, checkpoint_steps=5,
                                 eval_steps=0, checkpoint_ms_per_step=17.6)}, 1)
    name, share, evidence = ranks[0].lever()
    assert (name, share) == ("checkpoint", 0.15)
    assert evidence == "15% of the wall time of the last 50 steps saving checkpoints (5 of them " \
                       "paused, 17.6 ms a step on average)"
    # AND doctor names it as a pause of the wall time
    report = Report()
    check_throughput(report, docs(row(checkpoint_share=0.15, checkpoint_steps=5)))
    assert report.findings[0].title.startswith("LOW THROUGHPUT: checkpoint pauses: saving "
                                               "checkpoints takes 15% of the wall time")
    # AND against a traced-step lever, seconds per step decide: host 47% of a 6.1 ms median
    # step (2.9 ms) loses to checkpoints of 7.3 ms a step (the fault suite's tp_ckpt job) ...
    tp_ckpt = row(host_share=0.47, step_ms=6.1, checkpoint_share=0.29, checkpoint_ms_per_step=7.3)
    assert from_rows({0: tp_ckpt}, 1)[0][0].lever()[0] == "checkpoint"
    # ... and wins against checkpoints of 2 ms a step
    tp_ckpt["checkpoint_ms_per_step"] = 2.0
    assert from_rows({0: tp_ckpt}, 1)[0][0].lever()[0] == "host"
    # AND a pause under 10% is no lever
    assert from_rows({0: row(eval_share=0.05)}, 1)[0][0].lever() is None


def test_on_cuda_the_host_lever_is_the_gpu_outside_the_model():
    lv = from_rows({0: row(host_share=0.5, forward_share=0.2, backward_share=0.2,
                           on_cuda=True)}, 1)[0][0].to_json()["lever"]
    assert lv["lever"] == "host" and "GPU outside the model's kernels" in lv["evidence"]
    assert lv["next"].startswith("probe profile")
    lv = from_rows({0: row(host_share=0.5, forward_share=0.2, backward_share=0.2)}, 1)[0][0]
    assert "host code outside the modules" in lv.lever()[2]


def test_a_silent_rank_is_estimated_not_left_out_of_the_job_headline():
    from probe_cli.render.throughput import render_throughput

    # GIVEN a 2-rank job where rank 1 did not answer
    ranks, job = from_rows({0: row()}, 2)
    j = job.to_json()
    # THEN the job's tokens/s count the silent rank as the answering one (not half the job)
    assert j["tokens_per_s"] == 2 * 2560.0 and j["estimated_ranks"] == 1
    head = render_throughput(ranks, j)[0]
    assert head.startswith("job (estimated: 1/2 ranks answered"), head
    assert "5.12 ktokens/s" in head


def test_no_token_count_says_why_and_prints_no_none():
    from probe_cli.render.throughput import render_throughput

    # GIVEN a job whose inputs are images (no token ids) and no logged tokens
    no_tok = row(tokens=None, tokens_per_s=None, context_len=None, tokens_source=None)
    ranks, job = from_rows({0: no_tok, 1: no_tok}, 2)
    text = "\n".join(render_throughput(ranks, job.to_json()))
    # THEN no "?"/None stands in for the figure: the text says why there is none
    assert "None" not in text and "? tokens/s" not in text and "GB_tok ?" not in text, text
    assert "no token count" in text and "probe_agent.log(tokens=N)" in text


def test_a_compiled_job_says_why_its_flops_are_unknown():
    from probe_cli.render.throughput import render_throughput

    # GIVEN litgpt pretrain (torch.compile from the start): the FLOP meter never counts a step
    c = row(flops=None, flops_per_s=None, compute_flops_per_s=None, compiled=True)
    ranks, job = from_rows({0: c, 1: c}, 2)
    text = "\n".join(render_throughput(ranks, job.to_json()))
    # THEN the "?" says why ("FLOPs/token ? measured" and "MFU ?" said nothing)
    assert "FLOPs not measured under torch.compile" in text, text
    # (an eager job's line is as before)
    ranks, job = from_rows({0: row(), 1: row()}, 2)
    assert "torch.compile" not in "\n".join(render_throughput(ranks, job.to_json()))


def test_a_constant_lr_is_not_the_loop_setting_it():
    from probe_cli.render.throughput import schedule_lines

    held = {"lr_first": 1e-3, "lr_first_step": 1, "lr_peak": 1e-3, "lr_peak_step": 1,
            "lr_last": 1e-3, "lr_last_step": 200, "warmup_steps": None}
    [line] = schedule_lines([{"scheduler": None, "observed": held}])
    assert "sets the LR itself" not in line and "constant" in line, line
