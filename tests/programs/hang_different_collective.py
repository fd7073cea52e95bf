"""One rank takes a different code path and calls broadcast where the others all_reduce."""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist
from hang_common import parse_args, start_healthy


def sync_metrics(t: torch.Tensor) -> None:
    dist.all_reduce(t)


def maybe_resync_weights(t: torch.Tensor) -> None:
    dist.broadcast(t, src=0)  # the odd rank believes it must resync


def main() -> None:
    args = parse_args()
    rank, model, optimizer, x, y = start_healthy(args)
    t = torch.ones(4)
    if rank == args.odd_rank:
        maybe_resync_weights(t)
    else:
        sync_metrics(t)
    threading.Event().wait()


if __name__ == "__main__":
    main()
