"""Heading for a CUDA OOM: a list of tensors on the device grows every step (64 MiB on CUDA,
2 MiB on CPU). On a GPU the job dies with CUDA out of memory once it fills the device;
`probe doctor` shows the growth, the headroom left and about how many steps remain.

    PROBE=1 python examples/cuda_oom.py            # on CUDA if available, else on CPU

Without a GPU the same growth shows in the process RSS (python.memory's rss column) instead of
CUDA allocated/reserved memory, and there is no headroom line.
"""

import argparse
import time

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=None,
               help="stop after N steps (default: until OOM on CUDA, 600 on CPU)")
p.add_argument("--mib-per-step", type=int, default=None, help="default: 64 on CUDA, 2 on CPU")
p.add_argument("--hold-s", type=float, default=0.0,
               help="after the last step, stay alive this long with the tensors still kept, so "
                    "the guide's commands can look at them (the guide's test uses this: on a slow "
                    "machine 600 steps may end before its second command runs)")
args = p.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
steps = args.steps if args.steps is not None else (0 if device == "cuda" else 600)
mib = args.mib_per_step or (64 if device == "cuda" else 2)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
kept = []  # the bug
step = 0
while steps == 0 or step < steps:
    x, y = torch.randn(64, 256, device=device), torch.randn(64, 1, device=device)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    kept.append(torch.ones(mib << 18, device=device))  # the bug: "kept for debugging"
    step += 1
    time.sleep(0.05)  # the rest of a real step
time.sleep(args.hold_s)
