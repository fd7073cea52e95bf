"""A token model for the throughput tests: integer inputs [B, T], gradient accumulation, DDP on
gloo under torchrun (or one process).

``--model linear``: one-hot inputs into two Linears, so every parameter is a matmul weight and
6·N·tokens is the model's FLOPs up to the biases; ``--model embed``: an Embedding first (its
gather is no matmul: measured FLOPs fall below 6N).

``--tp 2``: no DDP; a DeviceMesh (dp=1, tp=2) over the ranks and the hidden layers made
tensor parallel (ColwiseParallel, then RowwiseParallel): both ranks feed the same tokens.

``--schedule cosine --warmup W --sched-total E``: a hand-written warmup+cosine LambdaLR (the
usual recipe) stepped once per optimizer step, warming up for W steps and ending at step E.

``--device cuda``: model and inputs on the GPU; ``--host-ms H``: H ms of host-only work
(a sleep, outside every module) after each optimizer step: the GPU sits idle through it.

``--ckpt-every K --ckpt-mb M``: torch.save of the model and M MiB of padding every K steps;
``--eval-every E``: ``model.eval()``, 3 forwards under no_grad and 20 ms of host work,
``model.train()`` every E steps.
Both right after an optimizer step; the script times them itself and appends
``step ckpt_seconds eval_seconds`` to ``<ready_dir>/pauses{rank}.txt`` (step: the optimizer
step whose interval they fall in, the next one).

Each rank appends ``step seconds`` for every optimizer step to ``<ready_dir>/steps{rank}.txt``,
timed here independently of the agent (from one ``opt.step()`` return to the next), announces
after ``--ready-step`` steps (tests/programs/ready.py) with its batch, accumulation and context,
then steps until ``--stop-file``.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ready import announce

torch.set_num_threads(1)
VOCAB, DIM = 64, 256


class LinearLM(nn.Module):
    """Only Linears: [B, T] token ids -> one-hot -> hidden x2 -> logits. (The first layer needs
    no input gradient, so its backward is 2 of 4 FLOPs per weight, not 4 of 6: the hidden
    layers keep the model near 6N, as a real LM's many layers do.)"""

    def __init__(self, vocab: int = VOCAB, dim: int = DIM) -> None:
        super().__init__()
        self.vocab = vocab
        self.up = nn.Linear(vocab, dim)
        self.hidden = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))
        self.down = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = F.one_hot(idx, self.vocab).float()
        return self.down(torch.relu(self.hidden(torch.relu(self.up(x)))))


class EmbedLM(nn.Module):
    def __init__(self, vocab: int = VOCAB, dim: int = DIM) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.down = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.wte(idx)))


MODELS = {"linear": LinearLM, "embed": EmbedLM}


def warmup_cosine(warmup: int, total: int):  # noqa: ANN201 - a LambdaLR factor
    def lr_factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1 + math.cos(math.pi * progress)))
    return lr_factor


def pauses(args: argparse.Namespace, step: int, model: nn.Module, train: nn.Module, rank: int,
           g: torch.Generator) -> None:
    ck = ev = 0.0
    if args.ckpt_every and step % args.ckpt_every == 0:
        state = {"model": model.state_dict(), "pad": torch.zeros(args.ckpt_mb << 18)}
        t0 = time.perf_counter()  # the save alone: what the agent times
        torch.save(state, os.path.join(args.ready_dir, f"ck{rank}.pt"))
        ck = time.perf_counter() - t0
    if args.eval_every and step % args.eval_every == 0:
        t0 = time.perf_counter()
        train.eval()
        with torch.no_grad():
            for _ in range(3):
                train(torch.randint(0, VOCAB, (args.batch, args.context), generator=g))
        time.sleep(0.02)  # the eval's own host work (metrics, logging)
        train.train()
        ev = time.perf_counter() - t0
    with open(os.path.join(args.ready_dir, f"pauses{rank}.txt"), "a") as f:
        f.write(f"{step + 1} {ck} {ev}\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(MODELS), default="linear")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--ready-step", type=int, default=30)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--host-ms", type=float, default=0.0)
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--ckpt-mb", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--schedule", choices=("none", "cosine"), default="none")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--sched-total", type=int, default=40)
    args = p.parse_args()
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    model = MODELS[args.model]().to(args.device)
    if args.tp > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        world = dist.get_world_size()
        mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
        parallelize_module(model.hidden, mesh["tp"], {"0": ColwiseParallel(),
                                                      "2": RowwiseParallel()})
        train = model
        data_rank = mesh.get_local_rank("dp")  # a TP group feeds one batch
    else:
        train = nn.parallel.DistributedDataParallel(model) if distributed else model
        data_rank = rank
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = (torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(args.warmup, args.sched_total))
             if args.schedule == "cosine" else None)
    g = torch.Generator().manual_seed(data_rank)
    log = open(os.path.join(args.ready_dir, f"steps{rank}.txt"), "a", buffering=1)
    step = 0
    last = time.perf_counter()
    while not os.path.exists(args.stop_file):
        for _ in range(args.accum):
            idx = torch.randint(0, VOCAB, (args.batch, args.context), generator=g).to(args.device)
            logits = train(idx)
            loss = F.cross_entropy(logits.flatten(0, 1), idx.flatten()) / args.accum
            loss.backward()
        opt.step()
        if args.host_ms:
            time.sleep(args.host_ms / 1e3)
        now = time.perf_counter()
        step += 1
        log.write(f"{step} {now - last}\n")
        last = now
        opt.zero_grad(set_to_none=True)
        if sched is not None:
            sched.step()
        if args.ckpt_every or args.eval_every:
            pauses(args, step, model, train, rank, g)
        if step == args.ready_step:
            announce(args.ready_dir, rank, batch=args.batch, accum=args.accum,
                     context=args.context, warmup=args.warmup, sched_total=args.sched_total,
                     world=dist.get_world_size() if distributed else 1)


if __name__ == "__main__":
    main()
