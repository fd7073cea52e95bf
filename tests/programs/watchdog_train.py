"""A torch training loop with the agent and its watchdog, to be killed by the test.

Writes ``--ready-file`` ({pid, url, unix_socket}) once ``--ready-step`` optimizer steps are
done, then trains on in ``train_forever`` until killed (or until ``--raise-at-step``, where it
raises an uncaught exception).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import probe_agent


def train_forever(model, optimizer, x, y, ready: str, ready_step: int, url: str, sock: str,
                  raise_at: int):
    step = 0
    while True:
        if step == raise_at:
            raise RuntimeError(f"loss exploded at step {step}")
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        step += 1
        if step == ready_step:
            with open(ready + ".tmp", "w") as f:
                json.dump({"pid": os.getpid(), "url": url, "unix_socket": sock}, f)
            os.replace(ready + ".tmp", ready)
        time.sleep(0.02)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ready-file", required=True)
    p.add_argument("--ready-step", type=int, default=5)
    p.add_argument("--raise-at-step", type=int, default=-1)
    args = p.parse_args()
    agent = probe_agent.start()
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    train_forever(model, optimizer, x, y, args.ready_file, args.ready_step, agent.url,
                  agent.unix_path, args.raise_at_step)


if __name__ == "__main__":
    main()
