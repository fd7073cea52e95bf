"""`probe memory` against a real agent (issue 29): the breakdown per rank with the top
activation modules and the advice, --json's field names, and --tensors naming a leak."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("duckdb")

from tests.integration.memory_support import AttnHeavy, run, steps  # noqa: E402
from tests.integration.tracing_support import rows  # noqa: E402

leaked: list = []  # a module global: the census finds it through the training thread's frames


def test_breakdown_names_the_attention_block_and_the_levers(make_agent, capsys):
    # GIVEN the attention-heavy model traced every step
    agent = make_agent(trace="on")
    model = AttnHeavy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps(model, opt, 4)
    rows(agent, "SELECT 1")
    # WHEN probe --json memory runs
    code, out, err = run(capsys, agent, "--json", "memory", "--warmup", "0")
    assert code == 0, err
    [body] = json.loads(out)
    bd = body["breakdown"]
    # THEN the kinds are the model's exact bytes, and the growth table is still there
    p_mib = sum(p.numel() * 4 for p in model.parameters()) / 2**20
    assert bd["parameters_mib"] == pytest.approx(p_mib, abs=0.01)
    assert bd["gradients_mib"] == pytest.approx(p_mib, abs=0.01)
    assert bd["optimizer_mib"] == pytest.approx(2 * p_mib, abs=0.01)
    # AND --json carries them in exact bytes too (0.01 MiB rounding was 3% of a small model)
    p_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert bd["bytes"]["parameters"] == p_bytes and bd["bytes"]["gradients"] == p_bytes
    # AdamW: exp_avg and exp_avg_sq, and one float32 `step` scalar per parameter
    n_params = len(list(model.parameters()))
    assert bd["bytes"]["optimizer"] == 2 * p_bytes + 4 * n_params
    assert bd["activations_mib"] > bd["optimizer_mib"]
    assert bd["cause"] == "activations" and bd["capacity_mib"] is None
    assert "columns" in body and "mem_mib_per_step" in body["columns"]
    # AND the attention block leads the activations with most of them
    top = bd["top_activations"]
    assert top[0]["module"] == "attn" and top[0]["share"] > 0.5, top
    # AND the first lever is checkpointing it, its estimate its subtree minus its inputs
    first = bd["advice"][0]
    assert first["lever"] == "checkpoint" and "attn" in first["action"], bd["advice"]
    assert first["saves_mib"] == pytest.approx(top[0]["checkpoint_saves_mib"], rel=0.01) \
        or first["saves_mib"] > top[0]["checkpoint_saves_mib"]
    levers = [a["lever"] for a in bd["advice"]]
    assert "micro_batch" in levers and "bf16" not in levers  # 0.1 MiB of parameters: no lever
    assert all(a["saves_mib"] >= 1.0 for a in bd["advice"])
    assert "shard_optimizer" not in levers  # one rank: nothing to shard across
    # AND the text view shows the same with --advice
    code, out, err = run(capsys, agent, "memory", "--advice")
    assert code == 0, err
    assert "top activations" in out and "attn" in out and "1. checkpoint" in out, out
    assert "basis:" in out and "memory growth per step" in out


def test_tensors_name_a_growing_list_and_the_parameters(make_agent, capsys):
    # GIVEN a loop that keeps one (256, 256) float32 tensor per step in a list (the weight's
    # shape is one no other test makes: the census counts every tensor in this process)
    agent = make_agent(trace="off")
    model = torch.nn.Linear(7, 11)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train(n: int) -> None:
        for _ in range(n):
            model(torch.randn(4, 7)).sum().backward()
            opt.step()
            leaked.append(torch.randn(256, 256))

    train(3)
    code, out, err = run(capsys, agent, "--json", "memory", "--tensors", "--top", "50")
    assert code == 0, err
    [first] = json.loads(out)
    # WHEN three more steps run and the census is taken again
    train(3)
    code, out, err = run(capsys, agent, "--json", "memory", "--tensors", "--top", "50")
    assert code == 0, err
    [second] = json.loads(out)
    # THEN the (256, 256) group grew by 3, held by the list
    def group(body, shape):
        return next(g for g in body["groups"] if g["shape"] == shape and g["dtype"] == "float32")

    g1, g2 = group(first, "(256, 256)"), group(second, "(256, 256)")
    assert g1["count_change"] is None and g2["count"] - g1["count"] == 3
    assert g2["count_change"] == 3 and second["previous_step"] == 3
    assert g2["mib"] == pytest.approx(g2["count"] * 0.25)
    assert "leaked[" in (g2["holder"] or ""), g2
    # AND the weight, its gradient and AdamW's state are labelled
    by_kind = {g["kind"]: g for g in second["groups"] if g["shape"] == "(11, 7)"}
    assert by_kind["parameter"]["count"] == 1 and by_kind["parameter"]["holder"] == "weight"
    assert by_kind["gradient"]["holder"] == "weight.grad"
    assert by_kind["optimizer"]["count"] == 2  # exp_avg, exp_avg_sq
    assert by_kind["optimizer"]["holder"].startswith("AdamW.state[weight].exp_avg")
    assert g2["kind"] == "other"
    # AND the text view shows the growth
    train(1)
    code, out, err = run(capsys, agent, "memory", "--tensors")
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if "(256, 256)" in ln and "other" in ln)
    assert " +1 " in line and "leaked[" in line, out


def test_a_census_skips_torch_compiles_fake_tensors(make_agent, capsys):
    """A job that ran torch.compile keeps fake tensors with symbolic shapes alive (dynamo's
    caches); summing their sizes raised inside sympy and the census answered 500."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    # GIVEN a fake tensor of shape (s0, s1) alive beside a real one
    agent = make_agent(trace="off")
    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC])
    fake = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(torch.randn(5, 3),
                                                            symbolic_context=ctx)
    real = torch.randn(123, 7)
    # WHEN the census is taken
    code, out, err = run(capsys, agent, "--json", "memory", "--tensors", "--top", "10000")
    # THEN it answers, counts the real tensor, and says it left the fake one out
    assert code == 0, err
    [body] = json.loads(out)
    shapes = {g["shape"] for g in body["groups"]}
    assert "(123, 7)" in shapes and not any("s" in s for s in shapes), shapes
    assert body["skipped"] >= 1, body
    del fake, real


def test_under_torch_compile_activations_are_said_to_be_unmeasurable(make_agent, capsys):
    """The hooks that count saved activations stay off once torch.compile compiled a frame
    (AOTAutograd would trace them into its graphs): the breakdown said "activations 0 KiB"."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    # GIVEN a compiled model traced every step
    agent = make_agent(trace="on")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model.compile(backend="eager")  # in place: torch.compile(model) warns of global hooks
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    try:
        for _ in range(3):
            model(torch.randn(8, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
        rows(agent, "SELECT 1")
        # WHEN probe memory runs (--json, and text)
        code, out, err = run(capsys, agent, "--json", "memory", "--warmup", "0")
        assert code == 0, err
        bd = json.loads(out)[0]["breakdown"]
        code, text, err = run(capsys, agent, "memory")
    finally:
        torch._dynamo.reset()
        counters.clear()  # later tests' agents would take this process for a compiled job
    # THEN activations are not a measured zero: null, and why
    assert bd["activations_mib"] is None and "torch.compile" in bd["activations_note"], bd
    assert bd["parameters_mib"] > 0
    assert "activations 0 KiB" not in text and "activations not counted" in text, text
    assert "not measurable under torch.compile" in text, text
