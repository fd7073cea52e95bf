"""Small real models and a training loop for the torch-tracing tests (issue 3)."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

# These models are tiny: on 2 shared cores OpenMP's spinning threads make a step ~100x slower
# (1 s instead of 10 ms, measured under load), so one intra-op thread.
torch.set_num_threads(1)


class Attn(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, d: int, heads: int = 2) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attn(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Embedding, ``layers`` blocks, head; returns the loss."""

    def __init__(self, vocab: int = 64, d: int = 16, layers: int = 2, ctx: int = 8,
                 checkpoint: str | None = None) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.checkpoint = checkpoint

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.layers:
            if self.checkpoint is not None:
                from torch.utils.checkpoint import checkpoint

                x = checkpoint(block, x, use_reentrant=self.checkpoint == "reentrant")
            else:
                x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class Sleepy(nn.Module):
    """Sleeps ``seconds`` in its forward: the deliberately slow module."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return x * 1.0


def batch(b: int = 4, ctx: int = 8, vocab: int = 64, seed: int = 0) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, vocab, (b, ctx), generator=g),
            torch.randint(0, vocab, (b, ctx), generator=g))


def train(model: nn.Module, steps: int, lr: float = 1e-2) -> list[float]:
    """AdamW steps on one fixed batch; returns the losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    idx, tgt = batch()
    losses = []
    for _ in range(steps):
        loss = model(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def named_modules(model: nn.Module) -> set[str]:
    """Qualified names as the tracer reports them (the root by its class)."""
    return {name or type(model).__name__ for name, m in model.named_modules()
            if not isinstance(m, nn.ModuleList)}


def rows(agent: Any, sql: str) -> list[list[Any]]:
    """Flush everything recorded so far into DuckDB, then query."""
    agent.collectors.tracer.flush()
    agent.collectors.steps.flush(final=True)
    agent.store.flush()
    return agent.store.query(sql).rows
