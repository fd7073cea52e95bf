"""A 2-rank DDP job on gloo started with ``torch.multiprocessing.spawn`` (issue 17).

The parent only launches and waits in ``join``; the ranks have no RANK in their environment
and become ranks by calling ``init_process_group``. Each rank iterates a DataLoader with two
workers (rank 0: spawn workers, which run the .pth hook; rank 1: forked ones), then writes
``rank{N}.json`` ({rank, pid, url, unix_socket, worker_pids, parent_pid}) into ``--ready-dir``
and trains slowly until ``--stop-file`` exists.
"""

from __future__ import annotations

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from ready import announce  # tests/programs/ready.py, beside this script
from torch.utils.data import DataLoader, TensorDataset


def rank_main(rank: int, world: int, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8, num_workers=2, persistent_workers=True,
                        multiprocessing_context="spawn" if rank == 0 else "fork")
    batches = iter(loader)
    workers = [w.pid for w in batches._workers]  # started by iter(): their pids are known now
    step = 0
    while not os.path.exists(args.stop_file):
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            continue
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        step += 1
        if step == 3:
            announce(args.ready_dir, rank, parent_pid=os.getppid(), worker_pids=workers)
        time.sleep(0.05)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--nprocs", type=int, default=2)
    args = p.parse_args()
    with socket.socket() as s:  # the rendezvous port the ranks meet on
        s.bind(("127.0.0.1", 0))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(rank_main, args=(args.nprocs, args), nprocs=args.nprocs)


if __name__ == "__main__":
    main()
