"""Loss spikes and a NaN, found with no line of code: a classifier whose data has one bad batch
(step 100: wrong labels, a finite spike) and one corrupt sample (step 150: an all-zero row,
which the first layer divides by its norm: 0/0).

    PROBE=1 python examples/loss_spike.py --steps 250 --hold-s 600

Nothing is logged to the agent: it records the loss backward() was called on and the gradient
norm of every step by itself. `probe numerics` (or `probe doctor`) names the spike's step,
factor and batch, and where the NaN was born (module, op, sample), even though neither step was
traced; `probe guard --skip-nonfinite` makes the job skip such steps from then on.
"""

import argparse
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class UnitNorm(nn.Module):
    """Scales each sample to unit RMS, without an epsilon."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.pow(2).mean(-1, keepdim=True).sqrt()


p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=0, help="stop after N steps (0: run until Ctrl-C)")
p.add_argument("--spike-at", type=int, default=100)
p.add_argument("--nan-at", type=int, default=150)
p.add_argument("--hold-s", type=float, default=0.0,
               help="after --steps, stay alive this long (the probe commands can still ask)")
args = p.parse_args()

torch.manual_seed(0)
w = torch.randn(32, 10)
xs = torch.randn(1 << 14, 32)
data = DataLoader(TensorDataset(xs, (xs @ w).argmax(1)), batch_size=32, shuffle=True)
model = nn.Sequential(UnitNorm(), nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
step = 0
while args.steps == 0 or step < args.steps:
    for x, y in data:
        if step + 1 == args.spike_at:
            y = (y + 3) % 10  # a batch from a mislabelled shard: finite, confidently wrong
        if step + 1 == args.nan_at:
            x = x.clone()
            x[7] = 0.0  # a corrupt record
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if args.steps and step >= args.steps:
            break
time.sleep(args.hold_s)
