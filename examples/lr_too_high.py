"""A learning rate too high for the model: the gradient norm is far above the clipping
threshold on every step, so clip_grad_norm_ rescales every update and the loss stalls.

    PROBE=1 python examples/lr_too_high.py

`probe doctor` points at the clipping; `probe lr --scale 0.1` lowers the LR at the next step on
every rank (the scheduler is rescaled too), without a restart.
"""

import argparse

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=0, help="stop after N steps (0: run until Ctrl-C)")
args = p.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10_000, gamma=0.5)
w = torch.randn(16, 1) * 10
step = 0
while args.steps == 0 or step < args.steps:
    x = torch.randn(64, 16)
    y = x @ w
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
    scheduler.step()
    step += 1
