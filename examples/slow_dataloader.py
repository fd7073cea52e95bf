"""Slow training, low GPU use: the model waits for its input. Each sample costs 2 ms of Python
work in ``__getitem__`` (decoding, augmentation...), done in the main process (num_workers=0).

    PROBE=1 python examples/slow_dataloader.py

Steps take ~35 ms, of which ~32 ms is waiting for the DataLoader; on a GPU the device idles.
"""

import argparse
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.002)  # expensive per-sample work
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), torch.randn(1, generator=g)


p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=0, help="stop after N steps (0: run until Ctrl-C)")
p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers (the fix)")
args = p.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
loader = DataLoader(SlowDataset(), batch_size=16, shuffle=True, num_workers=args.workers)
step = 0
while args.steps == 0 or step < args.steps:
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step == args.steps:
            break
