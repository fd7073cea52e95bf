"""Two-rank gloo training whose c10d store dies mid-run (issue 7, faults).

The test hosts the TCPStore in a process of its own, starts this program once per rank, kills
the store, then touches --agent-file: each rank starts its agent only then, so its rank
registry meets a store that is gone (with PROBE=1 the agent would have registered before).
gloo's connections were made at init, so training itself goes on without the store.

    store_lost.py --store-port P --status-dir D --agent-file F   (RANK, WORLD_SIZE from env)

Writes D/rank{R}.json = {"pid", "step", "url"} after every step.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store-port", type=int, required=True)
    ap.add_argument("--status-dir", type=Path, required=True)
    ap.add_argument("--agent-file", type=Path, required=True)
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore("127.0.0.1", args.store_port, world_size=world, is_master=False,
                          timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    agent = None
    status = args.status_dir / f"rank{rank}.json"
    for step in range(1, 1_000_000):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        if agent is None and args.agent_file.exists():
            import probe_agent

            agent = probe_agent.start()
        tmp = status.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "step": step,
                                   "url": agent.url if agent else None}))
        tmp.replace(status)
        time.sleep(0.02)


if __name__ == "__main__":
    main()
