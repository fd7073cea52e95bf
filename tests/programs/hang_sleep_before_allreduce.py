"""One rank sleeps (an endless host-side stall) before the all_reduce the others wait in."""

from __future__ import annotations

import time

from hang_common import parse_args, start_healthy, train_step


def slow_host_work() -> None:
    time.sleep(3600)  # a host-side stall far longer than any step (a stuck checkpoint write)


def main() -> None:
    args = parse_args()
    rank, model, optimizer, x, y = start_healthy(args)
    if rank == args.odd_rank:
        slow_host_work()
    train_step(model, optimizer, x, y)


if __name__ == "__main__":
    main()
