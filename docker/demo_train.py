"""Demo job: a small GPT-style language model trained with DDP (gloo) on synthetic tokens.

Run it under torchrun with the agent (``probe launch -- torchrun --nproc-per-node=2 ...``) and
probe it. Everything lives inside ``main()`` on purpose: probe's eval still finds ``model``,
``optimizer``, ``train_loader`` and ``trainer`` through the main thread's frames.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 64, layers: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x))


class Tokens(Dataset):
    """Sequences a model can learn: each row counts up from a random start by a random stride
    of 1-3 (mod the vocabulary), so the loss falls well below chance (random tokens would sit
    at ln(vocab), and `probe doctor` would rightly call that NOT LEARNING)."""

    def __init__(self, n: int = 4096, seq: int = 32, vocab: int = 256) -> None:
        g = torch.Generator().manual_seed(0)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        stride = torch.randint(1, 4, (n, 1), generator=g)
        self.data = (start + stride * torch.arange(seq + 1)) % vocab

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.data[i]
        return row[:-1], row[1:]


class Trainer:
    def __init__(self) -> None:
        self.current_step = 0
        self.loss = float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10**9)
    ap.add_argument("--stop-file", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    distributed = "RANK" in os.environ and "MASTER_ADDR" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    model = TinyGPT()
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1000, gamma=0.5)
    train_loader = DataLoader(Tokens(), batch_size=8, shuffle=True)
    trainer = Trainer()
    loss_fn = nn.CrossEntropyLoss()
    while trainer.current_step < args.steps:
        for x, y in train_loader:
            optimizer.zero_grad(set_to_none=True)
            logits = model(x)
            loss = loss_fn(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
            loss.backward()
            optimizer.step()
            scheduler.step()
            trainer.current_step += 1
            trainer.loss = loss.item()
            if rank == 0 and trainer.current_step % 100 == 0:
                print(f"step {trainer.current_step} loss {trainer.loss:.3f}", flush=True)
            if args.stop_file and os.path.exists(args.stop_file):
                args.steps = 0
                break
            if trainer.current_step >= args.steps:
                break
        time.sleep(0)
    if distributed:
        # DDP's reducer holds the process group; drop it (and its cycles) first, or gloo's
        # worker threads outlive destroy_process_group into interpreter teardown, where one
        # freeing its last work's tensors needs the GIL and aborts the rank (torch PR 179291)
        del model, optimizer, scheduler
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
