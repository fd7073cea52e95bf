"""Collective faults and the ranks around them (tests/e2e/test_collective_faults.py and the
fault suite's collective scenarios, bench/collective_scenarios.py): a 2-rank DDP job on gloo,
healthy or with exactly one known fault chosen by ``--scenario``, made by rank ``--odd-rank``
(default the last; rank 0 for ``rank0_only``).

Scenarios (each fault starts at step ``--at``, right after every rank announced itself):

- ``healthy``: DDP steps with an explicit ``all_reduce`` of the loss, until ``--stop-file``.
- ``rank0_only``: ``if rank == 0: dist.all_reduce(...)`` of one scalar (``log_metric``): rank 0
  meets rank 1's next DDP gradient all-reduce, of another size.
- ``sizes``: both ranks all_reduce in ``sync_stats``, rank 1 with 5 elements, rank 0 with 4.
- ``dtype``: both all_reduce 4 elements in ``sync_stats``, rank 1 in float64.
- ``order``: ``sync_both``: rank 0 all_reduces then broadcasts, rank 1 broadcasts first.
- ``stall``: rank 1 sleeps in ``slow_eval`` past the process group's ``--timeout-s``: the job
  dies of the timeout (checked after death).
- ``missing_init``: rank 1 sleeps in ``load_shards`` before ``init_process_group``.
- ``unused`` / ``unused_found``: the model's ``aux`` head never reaches the loss (``unused``:
  DDP without ``find_unused_parameters``, which crashes at step 2 with "Expected to have
  finished reduction"; ``unused_found``: with it, the job runs and pays for the search).
- ``unused_none``: ``find_unused_parameters=True`` on a model that uses every parameter.
- ``loader_stuck``: rank 1's DataLoader worker 1 blocks in ``ShardDataset.__getitem__``.
- ``loader_healthy``: the same DataLoader (2 workers per rank), no worker blocks.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import ready  # tests/programs/ready.py, beside this script
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

SCENARIOS = ("healthy", "rank0_only", "sizes", "dtype", "order", "stall", "missing_init",
             "unused", "unused_found", "unused_none", "loader_stuck", "loader_healthy")


class Net(nn.Module):
    def __init__(self, aux: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        # an auxiliary head (unused*): the loss never reaches it unless use_aux
        self.aux = nn.Linear(32, 1) if aux else None

    def forward(self, x: torch.Tensor, use_aux: bool = False) -> torch.Tensor:
        h = self.body[1](self.body[0](x))
        out = self.body[2](h)
        return out + self.aux(h) if use_aux and self.aux is not None else out


class ShardDataset(Dataset):
    def __init__(self, stuck_from: int | None) -> None:
        self.stuck_from = stuck_from

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.stuck_from is not None and i >= self.stuck_from:
            info = torch.utils.data.get_worker_info()
            if info is not None and info.id == 1:
                read_remote_shard(i)
        # 8 distinct samples, one batch's worth: every batch is the same one, so the loss is as
        # smooth as with a fixed batch (random samples made LOSS SPIKE warnings by chance)
        g = torch.Generator().manual_seed(i % 8)
        return torch.randn(16, generator=g), torch.randn(1, generator=g)


def read_remote_shard(i: int) -> None:
    time.sleep(3600)  # a network read that never returns


def log_metric(value: torch.Tensor) -> None:
    dist.all_reduce(value)  # rank 0 only: the bug


def sync_stats(t: torch.Tensor) -> None:
    dist.all_reduce(t)


def sync_both(a: torch.Tensor, b: torch.Tensor, rank: int) -> None:
    if rank == 0:
        dist.all_reduce(a)
        dist.broadcast(b, src=0)
    else:
        dist.broadcast(b, src=0)
        dist.all_reduce(a)


def slow_eval() -> None:
    time.sleep(3600)  # far past the process group's timeout


def load_shards() -> None:
    time.sleep(3600)  # never reaches init_process_group


def fault(sc: str, rank: int, odd: int) -> None:
    if sc == "rank0_only" and rank == 0:
        log_metric(torch.ones(1))
    elif sc == "sizes":
        sync_stats(torch.ones(5 if rank == odd else 4))
    elif sc == "dtype":
        sync_stats(torch.ones(4, dtype=torch.float64 if rank == odd else torch.float32))
    elif sc == "order":
        sync_both(torch.ones(4), torch.ones(4), rank)
    elif sc == "stall" and rank == odd:
        slow_eval()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", choices=SCENARIOS, required=True)
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--stop-file")
    p.add_argument("--odd-rank", type=int, default=-1)
    p.add_argument("--at", type=int, default=8)
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--step-s", type=float, default=0.02)
    p.add_argument("--timeout-s", type=float, default=60)
    args = p.parse_args()
    sc = args.scenario
    env_rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    odd = args.odd_rank if args.odd_rank >= 0 else (0 if sc == "rank0_only" else world - 1)
    if sc == "missing_init":
        ready.announce(args.ready_dir, env_rank)
        if env_rank == odd:
            load_shards()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        Net(aux=sc.startswith("unused")),
        find_unused_parameters=sc in ("unused_found", "unused_none"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = None
    if sc in ("loader_stuck", "loader_healthy"):
        stuck = sc == "loader_stuck" and rank == odd
        ds = ShardDataset(stuck_from=args.at * 8 if stuck else None)
        loader = iter(DataLoader(ds, batch_size=8, num_workers=2))
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    for i in range(1, args.steps + 1):
        if i == args.at and sc != "missing_init":
            ready.announce(args.ready_dir, rank)
            fault(sc, rank, odd)
        if args.stop_file and os.path.exists(args.stop_file):
            break
        if loader is not None:
            x, y = next(loader)
        opt.zero_grad()
        out = model(x, use_aux=sc == "unused_none")
        loss = nn.functional.mse_loss(out, y)
        loss.backward()
        opt.step()
        report = loss.detach().clone()
        dist.all_reduce(report)
        if args.step_s:
            time.sleep(args.step_s)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
