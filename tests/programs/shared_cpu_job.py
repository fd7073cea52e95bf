"""One labelled CPU-sharing condition of the verdict fault suite (bench/shared_cpu_scenarios.py):
2 DDP ranks on gloo doing the same small matmul work each step, on a machine busy with other
work. The last rank is the odd one.

Scenarios: cpu_shared (healthy: both ranks free to run on every core, so which one waits for a
CPU is the scheduler's pick), cpu_compute (the odd rank does 5x the matmuls: a straggler that
computes more), cpu_pinned (each rank pinned to a CPU of its own, and a busy process pinned to
the odd rank's: its own cores are contended, a straggler).

Every rank writes ``rank{N}.json`` into ``--ready-dir`` once ``--ready-step`` steps are done.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import ready  # tests/programs/ready.py, beside this script
import torch
import torch.distributed as dist
import torch.nn as nn

#: A busy loop pinned to one CPU that ends when the rank that started it does.
HOG = """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
parent, n = os.getppid(), 0
while True:
    n += 1
    if n % 200_000 == 0 and os.getppid() != parent:
        break
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", required=True)
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--stop-file")
    p.add_argument("--ready-step", type=int, default=100)
    p.add_argument("--step-s", type=float, default=0.005, help="sleep per step (input)")
    args = p.parse_args()
    sc = args.scenario
    rank = int(os.environ["RANK"])
    odd = rank == int(os.environ["WORLD_SIZE"]) - 1
    hog = None
    if sc == "cpu_pinned":  # before the process group: gloo's threads inherit it
        cpus = sorted(os.sched_getaffinity(0))
        mine = cpus[rank % len(cpus)]
        os.sched_setaffinity(0, {mine})
        if odd:
            hog = subprocess.Popen([sys.executable, "-c", HOG, str(mine)])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(),
                                                              nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    a = torch.randn(96, 96)
    matmuls = 5 * 40 if sc == "cpu_compute" and odd else 40
    step = 0
    try:
        while not (args.stop_file and os.path.exists(args.stop_file)):
            time.sleep(args.step_s)
            x = a
            for _ in range(matmuls):  # the step's host compute (~3 ms at 40 on one core)
                x = torch.tanh(x @ a)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x[:, :64]), x[:, 64:65])
            loss.backward()  # DDP's gradient all-reduce
            optimizer.step()
            step += 1
            if step == args.ready_step:
                ready.announce(args.ready_dir, rank, step=step)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


if __name__ == "__main__":
    main()
