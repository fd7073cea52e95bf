"""A long, healthy training run (a small GPT-like MLP on synthetic data) that you want to
checkpoint mid-run, e.g. before a node is drained or preempted, without stopping it.

    PROBE=1 python examples/long_run.py
    PROBE=1 torchrun --nproc-per-node=2 examples/long_run.py   # the same, with DDP on gloo
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=0, help="stop after N steps (0: run until Ctrl-C)")
args = p.parse_args()

distributed = "RANK" in os.environ
if distributed:
    dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
if distributed:
    model = nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100_000)
step = 0
while args.steps == 0 or step < args.steps:
    x = torch.randn(64, 32)
    loss = nn.functional.mse_loss(model(x), x)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    step += 1
    time.sleep(0.005)  # the rest of a real step
