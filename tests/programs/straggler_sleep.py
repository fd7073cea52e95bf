"""Every rank trains in lockstep; one rank (``--odd-rank``) also sleeps ``--sleep`` s per step
(host-side work the others must wait for in their next collective)."""

from __future__ import annotations

import os
import time

import torch
from hang_common import announce, parse_args, setup, train_step


def load_batch_slowly(seconds: float) -> None:
    time.sleep(seconds)


def main() -> None:
    args = parse_args([("--sleep", {"type": float, "default": 0.05})])
    rank, _, model, optimizer = setup(args)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    step = 0
    while not (args.stop_file and os.path.exists(args.stop_file)):
        if rank == args.odd_rank:
            load_batch_slowly(args.sleep)
        train_step(model, optimizer, x, y)
        step += 1
        if step == args.healthy_steps:
            announce(args.ready_dir)


if __name__ == "__main__":
    main()
