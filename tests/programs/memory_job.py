"""A nanoGPT-style job for the memory tests and demos (issue 29): ``--parallel ddp`` (2 gloo
ranks under torchrun, DistributedDataParallel) or ``fsdp2`` (``fully_shard`` on each block, then
the root: parameters, gradients and AdamW's state are DTensor shards), AdamW, tied embedding.

After ``--ready-step`` steps each rank announces (tests/programs/ready.py) with what it holds,
counted here independently of the agent: ``params``, ``grads``, ``optimizer`` (bytes of this
rank's local tensors: ``to_local()`` of DTensors), then keeps stepping until ``--stop-file``.

Run: ``PROBE=1 PROBE_TRACE=on torchrun --nproc-per-node=2 tests/programs/memory_job.py
--parallel ddp --ready-dir D --stop-file F``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ready import announce

torch.set_num_threads(1)


class Attn(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (c // self.h) ** 0.5)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)  # nanoGPT's slow path
        return self.c_proj((att @ v).transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attn(d, h)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int = 512, d: int = 64, layers: int = 4, ctx: int = 128,
                 heads: int = 4) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as nanoGPT

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def local_bytes(t: torch.Tensor) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def held(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    params = list(model.parameters())  # tied weights once
    return {"params": sum(local_bytes(p) for p in params),
            "grads": sum(local_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(local_bytes(v) for s in opt.state.values() for v in s.values()
                             if isinstance(v, torch.Tensor))}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--parallel", choices=["ddp", "fsdp2"], default="ddp")
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--ready-step", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--step-sleep", type=float, default=0.0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model: nn.Module = GPT()
    if args.parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.h:
            fully_shard(block)
        fully_shard(model)
        train = model
    else:
        train = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    idx = torch.randint(0, 512, (args.batch, 128), generator=g)
    tgt = torch.randint(0, 512, (args.batch, 128), generator=g)
    step = 0
    while not os.path.exists(args.stop_file):
        loss = train(idx, tgt)
        loss.backward()
        opt.step()
        step += 1
        if step == args.ready_step:
            announce(args.ready_dir, rank, **held(model, opt))
        opt.zero_grad(set_to_none=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)


if __name__ == "__main__":
    main()
