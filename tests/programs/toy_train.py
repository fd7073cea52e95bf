"""A small CPU training job shaped like the seed playbook expects.

It defines ``model``, ``optimizer``, ``train_loader`` and ``trainer`` (with ``current_step``)
either at module level (default) or inside ``main()`` (``--scope local``), runs under plain
python or torchrun (gloo), and signals readiness by atomically writing ``rank{N}.json``
({rank, pid, url, unix_socket}) into ``--ready-dir``. It trains until ``--stop-file`` exists or
``--steps`` is reached.

The agent comes from PROBE=1 (the .pth hook) or ``--start-agent`` (``probe_agent.start()``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import ready  # tests/programs/ready.py, beside this script
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self.current_step = 0
        self.last_loss = float("nan")


def build(workers: int) -> tuple[nn.Module, torch.optim.Optimizer, DataLoader]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = TensorDataset(torch.randn(512, 32), torch.randn(512, 1))
    loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=workers)
    return model, optimizer, loader


def announce(ready_dir: str | None) -> None:
    ready.announce(ready_dir, int(os.environ.get("RANK", 0)))


def train(trainer: Trainer, loader: DataLoader, args: argparse.Namespace) -> None:
    model, optimizer = trainer.model, trainer.optimizer
    loss_fn = nn.MSELoss()
    while trainer.current_step < args.steps:
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            if torch.distributed.is_initialized() and not args.no_sync:
                for p in model.parameters():
                    torch.distributed.all_reduce(p.grad)
            optimizer.step()
            trainer.current_step += 1
            trainer.last_loss = loss.item()
            if trainer.current_step == 1:
                announce(args.ready_dir)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if args.stop_file and os.path.exists(args.stop_file):
                return
            if trainer.current_step >= args.steps:
                return


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ready-dir")
    p.add_argument("--stop-file")
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--step-sleep", type=float, default=0.01)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--scope", choices=["module", "local"], default="module")
    p.add_argument("--start-agent", action="store_true")
    p.add_argument("--no-sync", action="store_true",
                   help="never all-reduce: each rank trains its own copy (imagenet on CPU)")
    args = p.parse_args()
    if args.start_agent:
        import probe_agent

        probe_agent.start()
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
        torch.distributed.init_process_group("gloo")
    if args.scope == "local":
        model, optimizer, train_loader = build(args.workers)
        trainer = Trainer(model, optimizer)
        train(trainer, train_loader, args)
    else:
        g = globals()
        g["model"], g["optimizer"], g["train_loader"] = build(args.workers)
        g["trainer"] = Trainer(g["model"], g["optimizer"])
        train(g["trainer"], g["train_loader"], args)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
