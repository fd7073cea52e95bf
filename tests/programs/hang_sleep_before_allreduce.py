"""One rank sleeps (an endless host-side stall) before the all_reduce the others wait in."""

from __future__ import annotations

import time

import torch
from hang_common import announce, parse_args, setup, train_step


def slow_host_work() -> None:
    time.sleep(3600)  # a host-side stall far longer than any step (a stuck checkpoint write)


def main() -> None:
    args = parse_args()
    rank, _, model, optimizer = setup(args)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    for _ in range(args.healthy_steps):
        train_step(model, optimizer, x, y)
    announce(args.ready_dir)
    if rank == args.odd_rank:
        slow_host_work()
    train_step(model, optimizer, x, y)


if __name__ == "__main__":
    main()
