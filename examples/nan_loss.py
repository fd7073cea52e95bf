"""Loss goes NaN: from step 15 one sample in every batch is corrupt (an Inf feature).

    PROBE=1 python examples/nan_loss.py

The model trains normally, then a corrupt record poisons the loss, the gradients (the clipping
in the loop does not help: the norm of a NaN gradient is NaN) and then every weight. The script
logs its loss with ``probe_agent.log`` so `probe doctor` can say at which step it went bad.
"""

import argparse

import torch
import torch.nn as nn

import probe_agent

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=0, help="stop after N steps (0: run until Ctrl-C)")
p.add_argument("--bad-from", type=int, default=15, help="first step with a corrupt sample")
args = p.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
step = 0
while args.steps == 0 or step < args.steps:
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    if step + 1 >= args.bad_from:
        x[0, 3] = float("inf")  # the corrupt record
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=5.0)
    optimizer.step()
    step += 1
    probe_agent.log(loss=loss.detach())  # no-op without an agent
