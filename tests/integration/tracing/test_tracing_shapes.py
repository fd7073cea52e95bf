"""Self time and names are right on the model shapes real jobs have (issue 17): gradient
accumulation (2 micro-batches per optimizer step), activation-checkpointed transformers layers
(``GradientCheckpointingLayer`` has its own ``__call__``), a parent module that is never called
(Lightning's ``self.net``), and steps disturbed by something else on the cores."""

from __future__ import annotations

import os
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("duckdb")

import torch.nn as nn  # noqa: E402

from probe_agent.store.catalog import load_queries  # noqa: E402
from tests.integration.tracing_support import Sleepy, TinyGPT, batch, rows  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def slow(agent, steps: int, limit: int = 500) -> dict[str, dict[str, float]]:
    """slow_modules as the agent serves it to `probe slow` and `probe doctor`, by module."""
    rows(agent, "SELECT 1")  # flush what was recorded
    res = agent.store.query(load_queries()["slow_modules"].sql,
                            params={"last": steps, "limit": limit})
    return {r[1]: dict(zip(res.columns, r)) for r in res.rows}


def tiny_gpt2(checkpointing: bool) -> nn.Module:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=8,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    if checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    return model.train()


def check_nesting(got: dict[str, dict[str, float]]) -> None:
    """Per step: 0 <= self <= the module's own time <= its parent's time."""
    for name, r in got.items():
        assert r["fwd_self_ms"] >= 0 and r["bwd_self_ms"] >= 0, r
        assert r["fwd_self_ms"] <= r["fwd_ms"] + 1e-3 and r["bwd_self_ms"] <= r["bwd_ms"] + 1e-3, r
        parent = name.rpartition(".")[0]
        if parent in got:  # a parent's calls hold its children's (same calls per step here)
            p = got[parent]
            assert r["self_ms"] <= p["fwd_ms"] + p["bwd_ms"] + 1e-3, (r, p)


@pytest.mark.frameworks
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_gpt2_accumulation_self_time_is_per_call(make_agent, checkpointing):
    # GIVEN a transformers GPT-2 (its blocks define their own __call__), 2 micro-batches per
    # optimizer step, optionally with every block activation-checkpointed
    agent = make_agent(trace="on")
    torch.manual_seed(0)
    model = tiny_gpt2(checkpointing)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(4):
        for _ in range(2):
            x = torch.randint(0, 64, (2, 8))
            (model(input_ids=x, labels=x).loss / 2).backward()
        opt.step()
        opt.zero_grad()
    # WHEN the slowest modules are computed (what probe slow and probe doctor read)
    got = slow(agent, 3)
    # THEN names are full paths in the model the optimizer trains
    assert {"transformer.h.1.mlp", "transformer.h.0.mlp.act", "transformer.h.1.attn"} <= set(got)
    # AND each module's self time per step lies within [0, its time] and within its parent
    check_nesting(got)
    # AND recomputation is not a second forward call of the step
    assert got["transformer.h.0.mlp.act"]["calls_per_step"] == 2
    # AND a leaf's per-step figure is its median call times its calls per step
    [[med]] = rows(agent, "SELECT median(duration) FROM torch_trace WHERE step > 1 "
                          "AND module = 'lm_head' AND stage = 'forward'")
    assert got["lm_head"]["fwd_self_ms"] == pytest.approx(2 * med * 1e3, abs=2e-3)
    # AND the attention core's backward (matmuls, softmax, dropout: attn's own ops) runs after
    # c_proj's backward has ended and before c_attn's starts: it is attn's self time
    gaps = rows(agent, """
        SELECT c.step, c.seq, a.timestamp - (c.timestamp + c.cpu_duration)
        FROM torch_trace c JOIN torch_trace a USING (step, seq, stage)
        WHERE c.module = 'transformer.h.1.attn.c_proj' AND a.module = 'transformer.h.1.attn.c_attn'
          AND stage = 'backward' AND step > 1""")
    assert len(gaps) == 6 and all(g > 1e-5 for *_, g in gaps), gaps
    assert got["transformer.h.1.attn"]["bwd_self_ms"] > 0


class Regressor(nn.Module):
    """Like a LightningModule: the loop calls ``self.net``, never the module itself."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))


class Hiccup(nn.Module):
    """Sleeps in one call only: a step disturbed by something else on the cores."""

    def __init__(self, at_call: int) -> None:
        super().__init__()
        self.calls, self.at_call = 0, at_call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.at_call:
            time.sleep(0.1)
        return x


def test_never_called_parent_names_and_disturbed_steps(make_agent):
    # GIVEN a parent that is never called (its net is), one step disturbed by a 100 ms stall
    agent = make_agent(trace="on")
    model = Regressor()
    model.net.insert(1, Hiccup(at_call=4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(7):
        model.net(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    got = slow(agent, 6)
    # THEN layers are named from the parent whose parameters the optimizer holds
    assert {"net", "net.0", "net.1", "net.3"} <= set(got), sorted(got)
    assert not {"0", "1", "3"} & set(got)
    check_nesting(got)
    # AND one disturbed step of six does not make the module slow per step
    assert got["net.1"]["fwd_self_ms"] < 5, got["net.1"]
    [[worst]] = rows(agent, "SELECT max(duration) FROM torch_trace WHERE module = 'net.1'")
    assert worst >= 0.1


def test_reentrant_checkpointed_blocks_nest_within_their_parents(make_agent):
    # GIVEN torch.utils.checkpoint(use_reentrant=True) around every block (its backward is an
    # inner pass over recompute calls), 2 micro-batches per optimizer step
    agent = make_agent(trace="on")
    model = TinyGPT(layers=2, checkpoint="reentrant")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(4):
        for _ in range(2):
            (model(*batch()) / 2).backward()
        opt.step()
        opt.zero_grad()
    got = slow(agent, 3)
    # THEN every module's self time lies within its own and its parent's, and the recompute
    # is no second forward call
    check_nesting(got)
    assert got["layers.1.attn"]["calls_per_step"] == 2
    assert got["layers.1.attn"]["bwd_self_ms"] > 0


def test_optimizer_step_with_a_closure_is_not_charged_for_the_model(make_agent):
    # GIVEN Lightning's way of stepping: optimizer.step(closure) runs forward and backward,
    # and one layer sleeps 20 ms per call
    agent = make_agent(trace="on")
    model = Regressor()
    model.net.insert(1, Sleepy(0.02))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model.net(torch.randn(4, 8)).sum()
        loss.backward()
        return loss

    for _ in range(5):
        opt.step(closure)
    got = slow(agent, 3)
    # THEN the sleeping layer is the slowest, not the optimizer step around it
    top = max(got.values(), key=lambda r: r["self_ms"])
    assert top["module"] == "net.1", sorted(got.items(), key=lambda kv: -kv[1]["self_ms"])[:3]
    # AND the optimizer is not listed among the modules (nor its time as a forward)
    assert "SGD" not in got, got["SGD"]
    check_nesting(got)
