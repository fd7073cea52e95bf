"""Trains until one rank is SIGKILLed from outside; survivors catch the collective's error and
wait for a restart (as fault-tolerant trainers do), so they stay up to be probed.

The test stops the torchrun launcher first: otherwise it tears every rank down at once, as a
node's own agent does, while ranks on other nodes would not notice so fast.
"""

from __future__ import annotations

import os
import threading

from hang_common import parse_args, start_healthy, train_step


def wait_for_restart(error: BaseException) -> None:
    print(f"rank lost a peer ({type(error).__name__}); waiting for a restart", flush=True)
    threading.Event().wait()


def main() -> None:
    args = parse_args()
    rank, model, optimizer, x, y = start_healthy(args)
    try:
        while not (args.stop_file and os.path.exists(args.stop_file)):
            train_step(model, optimizer, x, y)
    except RuntimeError as e:
        wait_for_restart(e)


if __name__ == "__main__":
    main()
