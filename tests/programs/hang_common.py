"""Shared pieces of the hang and straggler programs: a small DDP job on gloo.

Each program trains a few healthy steps (DDP gradient all-reduces plus an explicit all_reduce of
the loss), then makes one rank (``--odd-rank``, default the last) misbehave. Every rank writes
``rank{N}.json`` ({rank, pid, url}) into ``--ready-dir`` right before the point where the job
goes wrong, so a test knows every agent is up without sleeping.
"""

from __future__ import annotations

import argparse

import ready  # tests/programs/ready.py, beside this script
import torch
import torch.distributed as dist
import torch.nn as nn


def parse_args(extra: list[tuple[str, dict]] = ()) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--stop-file")
    p.add_argument("--odd-rank", type=int, default=-1, help="-1: the last rank")
    p.add_argument("--healthy-steps", type=int, default=3)
    for flag, kw in extra:
        p.add_argument(flag, **kw)
    return p.parse_args()


def setup(args: argparse.Namespace) -> tuple[int, int, nn.Module, torch.optim.Optimizer]:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.odd_rank < 0:
        args.odd_rank = world - 1
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    )
    return rank, world, model, torch.optim.SGD(model.parameters(), lr=0.01)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()  # DDP's gradient all-reduce: visible only to the Flight Recorder
    optimizer.step()
    report = loss.detach().clone()
    dist.all_reduce(report)  # an explicit collective: wrapped, with call site and timing
    return report


def announce(ready_dir: str, **extra: object) -> None:
    ready.announce(ready_dir, dist.get_rank(), **extra)


def start_healthy(
    args: argparse.Namespace,
) -> tuple[int, nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    """Set up the job, run ``--healthy-steps`` good steps, then announce readiness."""
    rank, _, model, optimizer = setup(args)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    for _ in range(args.healthy_steps):
        train_step(model, optimizer, x, y)
    announce(args.ready_dir)
    return rank, model, optimizer, x, y
