"""One labelled condition of the verdict fault suite (bench/verdicts.py, tests/e2e/
test_verdicts.py): a 2-rank DDP job on gloo that is healthy, or has exactly one known fault,
chosen by ``--scenario``. Rank ``--odd-rank`` (default the last) is the one that misbehaves.

Every rank writes ``rank{N}.json`` into ``--ready-dir`` when the job has reached the state to be
judged (``--ready-step`` steps done, or right before the fault starts). The loss is logged with
``probe_agent.log`` so NaN/Inf and spikes are visible to `probe doctor`.

Scenarios: healthy, busy (healthy; the harness adds a CPU hog), long_steps (8 s per step),
uneven (random per-step work on each rank, steady on average), slow_rank, hang_sleep,
hang_gil (C spin with the GIL held, ``--lib``), hang_dataloader, hang_collective, dead_rank
(the harness kills the odd rank), nan (loss NaN from ``--bad-from``), leak (256 KiB kept per
step), slow_input (a slow Dataset), lr_high (LR far too high: clipping on every step),
amp_scaled (AMP with a GradScaler, clip_grad_norm_ before scaler.unscale_: the clip sees the
norm x65536), amp_unscaled (the same loop, unscale_ first: healthy), own_lr (the loop sets a
cosine LR itself every step, nanoGPT's get_lr, and clips on every step: `probe lr` would be
undone), tp_ckpt (healthy, but every rank saves a 32 MiB checkpoint with torch.save every 4
steps: the saves are most of the wall time).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import random
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

import probe_agent

AMP = ("amp_scaled", "amp_unscaled")
HANGS = ("hang_sleep", "hang_gil", "hang_dataloader", "hang_collective", "dead_rank")


class WideAttn(nn.Module):
    """Attention over a made-up sequence: saves (B, 8, 128, 128) scores and probabilities."""

    def __init__(self, t: int = 128, c: int = 32, heads: int = 8) -> None:
        super().__init__()
        self.t, self.c, self.heads = t, c, heads
        self.qkv = nn.Linear(c, 3 * c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        q, k, v = self.qkv(x).split(self.c, dim=2)
        q, k, v = (z.reshape(b, self.t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax((q @ k.transpose(-2, -1)) * 0.5, dim=-1)
        return (att @ v).transpose(1, 2).reshape(b, self.t, self.c)


class AttnHeavy(nn.Module):
    def __init__(self, t: int = 128, c: int = 32) -> None:
        super().__init__()
        self.t, self.c = t, c
        self.up = nn.Linear(16, t * c)
        self.attn = WideAttn(t, c)
        self.head = nn.Linear(c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x).reshape(x.shape[0], self.t, self.c)
        return self.head(self.attn(h).mean(dim=1))


class BigEmbedding(nn.Module):
    """A 200k x 32 embedding (25.6 MB): AdamW's two states are twice that."""

    def __init__(self, rows: int = 200_000, dim: int = 32) -> None:
        super().__init__()
        self.rows = rows
        self.emb = nn.Embedding(rows, dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = (x.abs() * 10_000).long() % self.rows
        return self.head(self.emb(idx).mean(dim=1))


class Tiny(nn.Module):
    """tp_host: 300 Linear(16, 16) layers, each a few hundred FLOPs: the step is per-op
    overhead, not arithmetic."""

    def __init__(self, n: int = 300) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(n))
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


#: Throughput scenarios: the input batch is repeated this many times (tp_healthy: big matmuls)
REPEAT = {"tp_healthy": 16}


def build_model(sc: str) -> nn.Module:
    if sc == "tp_host":
        return Tiny()
    if sc == "tp_healthy":
        return nn.Sequential(nn.Linear(16, 512), *(nn.Linear(512, 512) for _ in range(4)),
                             nn.Linear(512, 1))
    if sc == "mem_activations":
        return AttnHeavy()
    if sc == "mem_optimizer":
        return BigEmbedding()
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))


class Samples(Dataset):
    """Synthetic samples; ``delay_s`` of per-sample work, or blocking forever once ``stuck``."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.stuck = False

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.stuck:
            threading.Event().wait()  # a worker that never delivers
        if self.delay_s:
            time.sleep(self.delay_s)
        g = torch.Generator().manual_seed(i % 4096)
        x = torch.randn(16, generator=g)
        return x, x[:1] * 3.0


def do_hang() -> None:
    threading.Event().wait()


def spin_with_gil(lib_path: str) -> None:
    lib = ctypes.PyDLL(lib_path)  # PyDLL: the GIL stays held during the call
    lib.spin.restype, lib.spin.argtypes = ctypes.c_double, [ctypes.c_double]
    lib.spin(3600.0)


def own_lr(step: int, warmup: int = 10, decay: int = 2000) -> float:
    """nanoGPT's get_lr: linear warm-up, then cosine from 2.0 down to 1.0 (clips every step)."""
    if step < warmup:
        return 2.0 * (step + 1) / warmup
    ratio = min(1.0, (step - warmup) / decay)
    return 1.0 + 0.5 * (1.0 + math.cos(math.pi * ratio)) * 1.0


def announce(ready_dir: str, step: int) -> None:
    from probe_agent.process import current

    agent = current()
    info = {"rank": dist.get_rank(), "pid": os.getpid(), "step": step,
            "url": agent.url if agent is not None else None}
    path = os.path.join(ready_dir, f"rank{info['rank']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(path + ".tmp", path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", required=True)
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--stop-file")
    p.add_argument("--odd-rank", type=int, default=-1)
    p.add_argument("--ready-step", type=int, default=60)
    p.add_argument("--step-s", type=float, default=0.03, help="host work per step")
    p.add_argument("--bad-from", type=int, default=30)
    p.add_argument("--lib", help="hang_gil: the spin library (tests/e2e/procs.py SPIN_C)")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    odd = (world - 1 if args.odd_rank < 0 else args.odd_rank) == rank
    sc = args.scenario
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(build_model(sc))
    lr = 2.0 if sc == "lr_high" else 0.01
    if sc.startswith("mem_"):
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu") if sc in AMP else None  # bf16 autocast: scale 65536
    data = Samples(0.004 if sc in ("slow_input", "tp_input") else 0.0)
    # tp_comm: a 4M-float all_reduce per step (16 MB through gloo), outside the model
    comm = torch.zeros(1 << 22) if sc == "tp_comm" else None
    loader = iter(DataLoader(data, batch_size=16))
    step_s = 8.0 if sc == "long_steps" else args.step_s
    rng = random.Random(rank)
    leaked: list[torch.Tensor] = []
    fault_at = args.ready_step if sc in HANGS else None
    step = 0
    try:
        while not (args.stop_file and os.path.exists(args.stop_file)):
            if step == fault_at and odd:
                if sc == "hang_sleep":
                    do_hang()
                elif sc == "hang_gil":
                    spin_with_gil(args.lib)
                elif sc == "hang_dataloader":
                    data.stuck = True
            x, y = next(loader)
            if sc in REPEAT:
                x, y = x.repeat(REPEAT[sc], 1), y.repeat(REPEAT[sc], 1)
            if sc == "nan" and step + 1 >= args.bad_from:
                x[0, 3] = float("inf")  # a corrupt record from here on
            work = step_s
            if sc == "uneven":
                work = rng.uniform(0.01, 0.07) + (0.001 if odd else 0.0)
            elif sc == "slow_rank" and odd:
                work += 0.1
            time.sleep(work)
            optimizer.zero_grad()
            if sc == "own_lr":
                for g in optimizer.param_groups:
                    g["lr"] = own_lr(step)
            if scaler is not None:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = nn.functional.mse_loss(model(x).float(), y)
                scaler.scale(loss).backward()
                if sc == "amp_unscaled":
                    scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=100.0)
                scaler.step(optimizer)
                scaler.update()
            else:
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()  # DDP's gradient all-reduce
                # lr_high: clipping rescales every update (what doctor's LR check reads)
                torch.nn.utils.clip_grad_norm_(
                    model.parameters(), max_norm=1.0 if sc in ("lr_high", "own_lr") else 100.0)
                optimizer.step()
            report = loss.detach().clone()
            if step == fault_at and odd and sc == "hang_collective":
                dist.broadcast(report, 0)  # the others call all_reduce: the paths diverged
            else:
                dist.all_reduce(report)
            if comm is not None:
                dist.all_reduce(comm)
            if sc == "leak":
                leaked.append(torch.randn(256, 256))  # 256 KiB kept every step
            if sc == "tp_ckpt" and step % 4 == 3:
                ck = {"model": model.state_dict(), "pad": torch.zeros(8 << 20)}  # 32 MiB
                torch.save(ck, os.path.join(args.ready_dir, f"ck{rank}.pt"))
            probe_agent.log(loss=loss.detach())
            step += 1
            if step == args.ready_step:
                announce(args.ready_dir, step)
    except RuntimeError as e:  # a peer died: wait for a restart, as fault-tolerant trainers do
        print(f"rank {rank} lost a peer ({type(e).__name__}); waiting", flush=True)
        do_hang()


if __name__ == "__main__":
    main()
