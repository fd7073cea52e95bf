"""A rank whose main thread is blocked in C (a condition wait that ignores EINTR, as gloo's and
NCCL's waits do) when SIGTERM comes: Python's handler cannot run there."""

from __future__ import annotations

import sys

import ready  # tests/programs/ready.py, beside this script
import torch


def blocked_in_c() -> None:
    torch.futures.Future().wait()  # never completed; the GIL is released while it waits


if __name__ == "__main__":
    ready.announce(sys.argv[1], 0)
    blocked_in_c()
