"""A small job that ends badly, for the post-mortem tests (tests/e2e/test_postmortem.py).

``--mode hang``: 2 ranks on gloo with a short process-group timeout; rank 1 stalls in
``do_hang`` inside step ``--at`` before the step's all_reduce, so rank 0's all_reduce times out
and the job dies on its own. ``--mode raise``: rank 1 raises at step ``--at``. ``--mode loop``:
one process stepping until it is killed (announces itself at step ``--at``). ``--mode abort``:
SIGABRT at step ``--at``. ``--mode clean``:
a few steps, then a normal exit.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import ready  # tests/programs/ready.py, beside this script
import torch
import torch.nn as nn


def do_hang() -> None:
    time.sleep(3600)  # far past the process group's timeout


def step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
         dist: object | None, stall: bool) -> None:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    if stall:
        do_hang()
    if dist is not None:
        dist.all_reduce(loss.detach().clone())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("hang", "raise", "loop", "clean", "abort"),
                   required=True)
    p.add_argument("--at", type=int, default=5)
    p.add_argument("--timeout-s", type=float, default=20)
    p.add_argument("--ready-dir")
    args = p.parse_args()
    dist = None
    rank = 0
    if args.mode in ("hang", "raise"):
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
        rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    for i in range(1, 1_000_000):
        if i == args.at:
            ready.announce(args.ready_dir, rank)
            if args.mode == "raise" and rank == 1:
                raise ValueError(f"loss went bad at step {i}")
            if args.mode == "abort":
                os.abort()  # as NCCL's watchdog does on a collective timeout: no Python runs
        step(model, opt, x, y, dist, stall=args.mode == "hang" and rank == 1 and i == args.at)
        if args.mode == "clean" and i >= args.at:
            break
        if args.mode == "loop":
            time.sleep(0.01)
    if dist is not None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
