"""A seeded training loop that prints a digest of every random number it draws.

The agent must never move the job's random state: the same seed gives the same digest with
and without ``PROBE=1``, whatever the agent measures along the way (the CPU peak probe runs on
the training thread at the first traced step). The loop draws from torch's global generator
(inputs, dropout), Python's ``random`` and numpy's global state when numpy is installed.

``--steps N``; prints ``DIGEST <hex>`` and ``PEAK <path exists>`` on its last line.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=24)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1234)
    random.seed(1234)
    try:
        import numpy as np
        np.random.seed(1234)
    except ImportError:
        np = None  # type: ignore[assignment]
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    h = hashlib.sha256()
    for _ in range(args.steps):
        x = torch.randn(16, 32)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        h.update(x.numpy().tobytes())
        h.update(repr(random.random()).encode())
        if np is not None:
            h.update(np.random.rand(2).tobytes())
    for q in model.parameters():
        h.update(q.detach().numpy().tobytes())
    run_dir = os.environ.get("PROBE_RUN_DIR", "")
    peak = os.path.exists(os.path.join(run_dir, "cpu_peak.json")) if run_dir else False
    print(f"DIGEST {h.hexdigest()} PEAK {peak}", flush=True)


if __name__ == "__main__":
    main()
