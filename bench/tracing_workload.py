"""The workload bench_tracing.py times, and the agent it runs under.

A GPT-style transformer (or a small MLP) with AdamW at the sizes of ``SIZES``, a ``Loop`` that
times its steps in several clocks, and starting and stopping the agent with the hot path chosen
on the command line (``NATIVE``, ``PATHS``: set by the driver before any arm runs). Separate from
the arms (tracing_blocks.py, tracing_paired.py) because other benches train the same model
(bench_profile.py, bench_memory_accounting.py) and must not pull in the tracing arms to get it.
"""

from __future__ import annotations

import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = {  # name -> (d_model, layers, batch, ctx, steps per block, rounds)
    # ~5 ms CPU steps: ``mlp`` a small MLP (6 x Linear+ReLU, width d, batch b: 14 module calls,
    # what a new user tries first); ``tiny`` the GPT's 102 module calls with little math in them
    # (the worst case: ~20 module calls per ms)
    "mlp": (256, 6, 128, 0, 10, 40),
    "tiny": (32, 8, 2, 16, 10, 40),
    "small": (64, 8, 4, 64, 10, 40),
    "large": (128, 8, 8, 128, 10, 12),
}


class GcCounter:
    """Counts the collector's runs and their time per generation (gc.callbacks): a full
    collection of a big process is a pause the step pays, whoever allocated."""

    def __init__(self) -> None:
        import gc

        self.n = [0, 0, 0]
        self.ms = [0.0, 0.0, 0.0]
        self._t = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            g = info["generation"]
            self.n[g] += 1
            self.ms[g] += (time.perf_counter() - self._t) * 1e3

    def snapshot(self) -> tuple[int, float]:
        return self.n[2], sum(self.ms)


GC = GcCounter()


class Attn(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.drop(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c)))


class MLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attn(d, h)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, ctx: int, heads: int = 4) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class MLPNet(nn.Module):
    def __init__(self, d: int, layers: int) -> None:
        super().__init__()
        self.net = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(d, d), nn.ReLU())])

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.net(x), target)


class Loop:
    def __init__(self, size: str) -> None:
        d, layers, b, ctx, self.block, self.rounds = SIZES[size]
        torch.manual_seed(0)
        if size == "mlp":
            self.model: nn.Module = MLPNet(d, layers)
            self.idx, self.tgt = torch.randn(b, d), torch.randn(b, d)
        else:
            self.model = GPT(512, d, layers, ctx)
            self.idx = torch.randint(0, 512, (b, ctx))
            self.tgt = torch.randint(0, 512, (b, ctx))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.calls = sum(1 for m in self.model.modules() if not isinstance(m, nn.ModuleList))

    def steps(self, n: int) -> tuple[float, ...]:
        """n steps -> mean (thread s, wall s, forward thread s, backward thread s, process CPU s
        incl. the agent's threads) per step, then full GC collections and GC ms in the block."""
        tt, pc = time.thread_time, time.perf_counter
        fwd = bwd = 0.0
        g0 = GC.snapshot()
        t0, w0, p0 = tt(), pc(), time.process_time()
        for _ in range(n):
            a = tt()
            loss = self.model(self.idx, self.tgt)
            b = tt()
            loss.backward()
            c = tt()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            fwd += b - a
            bwd += c - b
        g1 = GC.snapshot()
        return ((tt() - t0) / n, (pc() - w0) / n, fwd / n, bwd / n,
                (time.process_time() - p0) / n, g1[0] - g0[0], g1[1] - g0[1])


def start_agent(mode: str | None, retention_mb: int | None = None):  # type: ignore[no-untyped-def]
    import probe_agent
    from probe_agent.config import AgentConfig

    kw: dict[str, object] = {"port": 0, "run_dir": tempfile.mkdtemp(prefix="probe-b-"),
                             "watchdog": False, "trace_native": NATIVE}
    if mode is not None:
        kw["trace"] = mode
    if retention_mb is not None:
        kw["retention_mb"] = retention_mb
    return probe_agent.start(AgentConfig(**kw))


#: --native: the tracer's hot path (auto: the C++ one, built first if needed; off: Python).
NATIVE = "auto"
#: --paths: the hot paths --paired compares with untraced steps.
PATHS = ["python", "native"]


def load_native() -> str:
    """Build or load the C++ hot path before measuring, so that no run mixes the two paths."""
    from probe_agent.collectors.tracer.trace_native import LOADER

    if NATIVE == "off":
        return "python"
    LOADER.request(torch, NATIVE)
    LOADER.ready.wait(900)
    if LOADER.module is None:
        sys.exit(f"the C++ hot path is not available ({LOADER.status}); use --native off")
    return "native"


def stop_agent() -> None:
    import probe_agent

    probe_agent.stop()
