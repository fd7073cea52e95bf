"""A training loop started *without* probe (for `probe inject`), checking its own numerics.

Every step: a tiny model's SGD step, plus a fixed float32 matmul and a float64 sum whose
results must equal the first ones bit for bit. A difference means someone corrupted this
thread's registers; it is counted. ``--stats-file`` gets {pid, steps, bad} after every step
(atomically). With ``--lib`` and ``--go-file``: when the go file appears, the main thread spins
``--spin-s`` seconds in C holding the GIL (ctypes.PyDLL), once.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import time

import torch

torch.set_num_threads(1)  # one thread: the matmul result is deterministic


def numerics(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    m = float((a @ b).sum())
    s = math.fsum(math.sqrt(i) * 1.000001 for i in range(2000))
    return m, s


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               x: torch.Tensor, y: torch.Tensor) -> float:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return float(loss)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stats-file", required=True)
    p.add_argument("--lib")
    p.add_argument("--go-file")
    p.add_argument("--spin-s", type=float, default=5.0)
    p.add_argument("--step-sleep", type=float, default=0.01)
    args = p.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    a, b = torch.randn(96, 96), torch.randn(96, 96)
    lib = None
    if args.lib:
        lib = ctypes.PyDLL(args.lib)
        lib.spin.restype, lib.spin.argtypes = ctypes.c_double, [ctypes.c_double]
    expected = numerics(a, b)
    steps = bad = 0
    while True:
        train_step(model, optimizer, x, y)
        if numerics(a, b) != expected:
            bad += 1
        steps += 1
        tmp = args.stats_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"pid": os.getpid(), "steps": steps, "bad": bad}, f)
        os.replace(tmp, args.stats_file)
        if lib is not None and args.go_file and os.path.exists(args.go_file):
            os.unlink(args.go_file)
            lib.spin(args.spin_s)
        time.sleep(args.step_sleep)


if __name__ == "__main__":
    main()
