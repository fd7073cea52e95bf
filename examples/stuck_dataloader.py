"""A stuck DataLoader: a worker process blocks forever on one sample (a hung network read,
a lock taken before fork...) and the training loop waits for that batch.

    PROBE=1 python examples/stuck_dataloader.py

Trains normally for ~40 steps, then stops making progress without any error.
"""

import argparse
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class FlakyDataset(Dataset):
    def __init__(self, stuck_at: int) -> None:
        self.stuck_at = stuck_at

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == self.stuck_at:
            time.sleep(10**6)  # e.g. a read from a dead NFS mount
        return torch.full((16,), float(i % 7)), torch.ones(1)


p = argparse.ArgumentParser()
p.add_argument("--stuck-at-batch", type=int, default=40)
args = p.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
batch = 8
loader = DataLoader(FlakyDataset(args.stuck_at_batch * batch), batch_size=batch, num_workers=1)
for x, y in loader:
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
