"""Trains until one rank is SIGKILLed from outside; survivors catch the collective's error and
wait for a restart (as fault-tolerant trainers do), so they stay up to be probed.

The test stops the torchrun launcher first: otherwise it tears every rank down at once, as a
node's own agent does, while ranks on other nodes would not notice so fast.
"""

from __future__ import annotations

import os
import threading

import torch
from hang_common import announce, parse_args, setup, train_step


def wait_for_restart(error: BaseException) -> None:
    print(f"rank lost a peer ({type(error).__name__}); waiting for a restart", flush=True)
    threading.Event().wait()


def main() -> None:
    args = parse_args()
    rank, _, model, optimizer = setup(args)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    for _ in range(args.healthy_steps):
        train_step(model, optimizer, x, y)
    announce(args.ready_dir)
    try:
        while not (args.stop_file and os.path.exists(args.stop_file)):
            train_step(model, optimizer, x, y)
    except RuntimeError as e:
        wait_for_restart(e)


if __name__ == "__main__":
    main()
