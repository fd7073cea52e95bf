"""A memory leak: each step's predictions are kept for an end-of-epoch metric, but they were
computed with autograd on, so every one keeps its autograd graph and activations alive
(the fix: ``with torch.no_grad():`` or ``.detach()``).

    PROBE=1 python examples/memory_leak.py

The process grows by about 1 MiB every step (it stops after 1,200 steps so as not to take your
machine down with it; a real job grows until the host or the GPU runs out of memory).
"""

import argparse
import time

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=1200, help="stop after N steps (0: never)")
args = p.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
held_out = torch.randn(512, 256)
predictions = []  # for an epoch-end metric
step = 0
while args.steps == 0 or step < args.steps:
    x, y = torch.randn(512, 256), torch.randn(512, 1)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    predictions.append(model(held_out))  # the bug: keeps 512x512 activations per step
    step += 1
    time.sleep(0.05)  # the rest of a real step
