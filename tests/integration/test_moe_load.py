"""Tokens per expert (probe_agent/collectors/moe.py) equal the router's own counts: a plain-code
top-2 MoE that counts what it routes, and a tiny HF Mixtral built from a config (its router
logits from ``output_router_logits``), both found with no code change."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn


class PlainMoE(nn.Module):
    """gate + experts in a ModuleList, top-k in its forward; keeps its own counts per call."""

    def __init__(self, dim: int = 16, experts: int = 4, top_k: int = 2) -> None:
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))
        self.own: list[Any] = []

    def forward(self, x: Any) -> Any:
        flat = x.reshape(-1, x.shape[-1])
        idx = self.gate(flat).topk(self.top_k, dim=-1).indices
        self.own.append(torch.bincount(idx.reshape(-1), minlength=len(self.experts)))
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows = (idx == e).any(dim=-1)
            out[rows] += expert(flat[rows])
        return out.reshape(x.shape)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(nn.ModuleDict({"mlp": PlainMoE()}) for _ in range(2))
        self.head = nn.Linear(16, 1)

    def forward(self, x: Any) -> Any:
        h = self.inp(x)
        for b in self.blocks:
            h = h + b["mlp"](h)
        return self.head(h)


def _loads(agent: Any) -> dict[tuple[int, str], list[int]]:
    agent.store.flush()
    rows = agent.store.query("SELECT step, layer, expert, tokens FROM python.moe_load "
                             "ORDER BY step, layer, expert").rows
    out: dict[tuple[int, str], list[int]] = {}
    for step, layer, _expert, tokens in rows:
        out.setdefault((step, layer), []).append(tokens)
    return out


def test_plain_moe_counts_equal_the_routers(make_agent):
    agent = make_agent(trace="on")
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    own: dict[int, dict[str, list[int]]] = {}
    for step in range(1, 6):
        for b in net.blocks:
            b["mlp"].own.clear()
        for _ in range(2):  # two micro-batches per step
            net(torch.randn(4, 8, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        own[step] = {f"blocks.{i}.mlp": sum(b["mlp"].own).tolist()
                     for i, b in enumerate(net.blocks)}
    got = _loads(agent)
    assert got, "no python.moe_load rows"
    steps = sorted({s for s, _ in got})
    assert steps == [2, 3, 4, 5], steps  # found at the first boundary, counted from step 2
    for (step, layer), tokens in got.items():
        assert tokens == own[step][layer], (step, layer, tokens, own[step][layer])
        assert sum(tokens) == 2 * 4 * 8 * 2  # micro-batches x tokens x top_k


def test_hf_mixtral_counts_equal_its_router_logits(make_agent):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg)
    agent = make_agent(trace="on")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    own: dict[int, dict[str, list[int]]] = {}
    for step in range(1, 5):
        ids = torch.randint(0, 64, (2, 12))
        out = model(input_ids=ids, labels=ids, output_router_logits=True)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        own[step] = {
            f"model.layers.{i}.mlp": torch.bincount(
                logits.topk(2, dim=-1).indices.reshape(-1), minlength=4).tolist()
            for i, logits in enumerate(out.router_logits)}
    got = _loads(agent)
    assert got, "no python.moe_load rows"
    assert sorted({s for s, _ in got}) == [2, 3, 4]
    for (step, layer), tokens in got.items():
        assert tokens == own[step][layer], (step, layer, tokens, own[step][layer])


def test_deepspeed_moe_counts_equal_its_gates(make_agent):
    # GIVEN DeepSpeed-MoE's own layer (MOELayer: TopKGate + Experts), top-2 over 4 experts; its
    # gate returns the tokens per expert (exp_counts) beside combine weights shaped by capacity
    layer = pytest.importorskip("deepspeed.moe.layer")
    torch.manual_seed(0)
    moe = layer.MoE(hidden_size=16, expert=nn.Linear(16, 16), num_experts=4, ep_size=1, k=2)
    agent = make_agent(trace="on")
    opt = torch.optim.SGD(moe.parameters(), lr=0.01)
    own: dict[int, list[int]] = {}
    for step in range(1, 5):
        out, aux, counts = moe(torch.randn(2, 12, 16))
        (out.sum() + aux).backward()
        opt.step()
        opt.zero_grad()
        own[step] = counts.tolist()
    # THEN the agent found it with no code change and counted what the gate counted
    got = _loads(agent)
    assert sorted({s for s, _ in got}) == [2, 3, 4], got
    for (step, name), tokens in got.items():
        assert name == "deepspeed_moe" and tokens == own[step], (step, name, tokens, own[step])
        assert sum(tokens) == 2 * 12 * 2
