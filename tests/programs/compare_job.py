"""A small job for `probe compare`: a few Linear blocks, a fixed amount of host work per step,
and optionally one block made slower (``--slow-ms``: ``blocks.1`` sleeps that long in its
forward, a stand-in for a change that slowed one module).

Under torchrun it trains data-parallel on gloo (DDP). Runs ``--steps`` steps and exits
cleanly (with PROBE_POSTMORTEM=always its tables stay on disk for `probe compare`), or, with
``--stop-file``, trains until that file exists; ``rank<N>.json`` in ``--ready-dir`` says it has
taken ``--ready-after`` steps.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from ready import announce  # tests/programs/ready.py, beside this script


class Block(nn.Module):
    def __init__(self, width: int, sleep_s: float) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.sleep_s = sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)  # host work inside this module only
        return torch.relu(self.fc(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--stop-file")
    p.add_argument("--ready-after", type=int, default=40)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--host-ms", type=float, default=30.0,
                   help="host work per step, outside modules")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one core per job: several run side by side in the tests
    model = nn.Sequential()
    for i in range(3):
        model.add_module(f"b{i}", Block(32, args.slow_ms / 1e3 if i == 1 else 0.0))
    rank = 0
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while True:
        if args.stop_file is None and step >= args.steps:
            break
        if args.stop_file is not None and os.path.exists(args.stop_file):
            break
        time.sleep(args.host_ms / 1e3)  # the loop's own host work (logging, data)
        x, y = torch.randn(8, 32), torch.randn(8, 32)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step == args.ready_after:
            announce(args.ready_dir, rank)


if __name__ == "__main__":
    try:
        main()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
