"""A DDP hang: at step 10 the last rank skips the all_reduce that averages the logged loss
(a metrics branch taken on one rank only), so every other rank waits in it forever.

    PROBE=1 torchrun --nproc-per-node=2 examples/ddp_hang.py

gloo on CPU; the same shape of bug hangs NCCL jobs on GPUs.
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--hang-at", type=int, default=10)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def log_metrics(loss: torch.Tensor, step: int) -> None:
    if rank == world - 1 and step >= args.hang_at:
        time.sleep(3600)  # the bug: this rank's logging path never joins the all_reduce
        return
    avg = loss.detach().clone()
    dist.all_reduce(avg)


step = 0
while True:
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()  # DDP's gradient all-reduce
    optimizer.step()
    step += 1
    log_metrics(loss, step)
