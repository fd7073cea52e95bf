"""The cost of the FLOP-measured step (FlopCounterMode over one whole step) as a ratio to an
ordinary step of the same model, and what it costs amortised at the rate it runs.

    .venv/bin/python bench/bench_flops.py            # GPT-like token model, 40 pairs
    .venv/bin/python bench/bench_flops.py --pairs 80 --layers 8

Each pair runs one ordinary step and one step under the agent's FlopMeter (entered and left at
the step boundaries exactly as the step recorder does), in random order, on one model; the
ratio is the median of the per-pair ratios. How often it runs: once per job, and again only
when the token input shapes change, at most every MIN_GAP steps; the worst case amortised cost
is (ratio - 1) / MIN_GAP of the step time.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from probe_agent.collectors.flops import MIN_GAP, FlopMeter  # noqa: E402


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(*(Block(d) for _ in range(layers)))
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.wte(idx)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    vocab = 256
    model = TinyGPT(vocab, args.dim, args.layers)
    opt = torch.optim.AdamW(model.parameters())
    meter = FlopMeter()

    def step() -> None:
        idx = torch.randint(0, vocab, (args.batch, args.context))
        F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    ratios, plain, measured = [], [], []
    n = 0
    for _ in range(args.pairs):
        times = {}
        for kind in random.sample(["plain", "measured"], 2):
            n += 1
            if kind == "measured":
                meter._want = True
                meter.boundary(torch, n, None, next_traced=True, tracing=True)  # enters
            t0 = time.perf_counter()
            step()
            times[kind] = time.perf_counter() - t0
            if kind == "measured":
                n += 1
                assert meter.boundary(torch, n, None, False, True) is not None  # leaves
        plain.append(times["plain"])
        measured.append(times["measured"])
        ratios.append(times["measured"] / times["plain"])
    ratio = statistics.median(ratios)
    print(f"model: {args.layers} blocks, d={args.dim}, B={args.batch}, T={args.context}, "
          f"{sum(p.numel() for p in model.parameters())} parameters, "
          f"{meter.flops:.3g} FLOPs per step")
    print(f"ordinary step: median {1e3 * statistics.median(plain):.2f} ms; "
          f"FLOP-measured step: median {1e3 * statistics.median(measured):.2f} ms")
    print(f"ratio measured/ordinary: x{ratio:.2f} (median of {args.pairs} pairs; "
          f"p10 x{statistics.quantiles(ratios, n=10)[0]:.2f}, "
          f"p90 x{statistics.quantiles(ratios, n=10)[-1]:.2f})")
    print(f"runs: once per job, again on new input shapes at most every {MIN_GAP} steps: "
          f"worst case +{100 * (ratio - 1) / MIN_GAP:.2f}% of step time amortised")
    return 0


if __name__ == "__main__":
    sys.exit(main())
