"""One rank takes a different code path and calls broadcast where the others all_reduce."""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist
from hang_common import announce, parse_args, setup, train_step


def sync_metrics(t: torch.Tensor) -> None:
    dist.all_reduce(t)


def maybe_resync_weights(t: torch.Tensor) -> None:
    dist.broadcast(t, src=0)  # the odd rank believes it must resync


def main() -> None:
    args = parse_args()
    rank, _, model, optimizer = setup(args)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    for _ in range(args.healthy_steps):
        train_step(model, optimizer, x, y)
    announce(args.ready_dir)
    t = torch.ones(4)
    if rank == args.odd_rank:
        maybe_resync_weights(t)
    else:
        sync_metrics(t)
    threading.Event().wait()


if __name__ == "__main__":
    main()
