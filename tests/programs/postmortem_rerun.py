"""One rank of a run torchrun did not name (TORCHELASTIC_RUN_ID=none, a fixed MASTER_PORT), for
tests/e2e/test_postmortem_runs.py: started twice on the same port, it must get a copy of its
own each time. ``--mode raise`` raises once its copy is in the run's agreed directory;
``--mode clean`` exits normally then."""

from __future__ import annotations

import argparse
import glob
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("raise", "clean"), required=True)
    p.add_argument("--root", required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    x = torch.ones(4)
    dist.all_reduce(x)
    # The ranks agree on the run's name at the copy's next refresh; wait for it (bounded).
    mine = os.path.join(args.root, f"*-{os.getpid()}", "rank-0", "meta.json")
    deadline = time.monotonic() + 60
    while not glob.glob(mine) and time.monotonic() < deadline:
        time.sleep(0.05)
    if args.mode == "raise":
        raise ValueError("loss went bad in the first run")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
