"""A model with one deliberately slow layer (``Preprocess`` sleeps ``--sleep`` s per forward).

Signals readiness by writing ``rank0.json`` into ``--ready-dir`` after ``--ready-after`` steps,
then trains until ``--stop-file`` exists. `probe doctor` must list ``slow`` first among the
slowest modules.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn as nn


class Preprocess(nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)  # host-side work inside the model
        return x * 1.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--ready-after", type=int, default=5)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("embed", nn.Linear(16, 32))
    model.add_module("slow", Preprocess(args.sleep))
    model.add_module("head", nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while not os.path.exists(args.stop_file):
        x, y = torch.randn(8, 16), torch.randn(8, 1)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step == args.ready_after:
            path = os.path.join(args.ready_dir, "rank0.json")
            with open(path + ".tmp", "w") as f:
                json.dump({"rank": 0, "pid": os.getpid()}, f)
            os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
