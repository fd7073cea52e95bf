"""Started with PROBE=1: the agent comes up (from the .pth hook) before this script imports
torch. It trains a few steps and writes what the agent recorded to --out (issue 3)."""

from __future__ import annotations

import argparse
import json
import sys
import time

TORCH_BEFORE = "torch" in sys.modules  # must be False: the agent may not import torch

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import probe_agent  # noqa: E402
from probe_agent.process import current  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--pause", type=float, default=0.0,
                   help="seconds to wait after `import torch`, for the tracer's C++ hot path to "
                        "load in the background (it arms at the import)")
    args = p.parse_args()
    time.sleep(args.pause)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(args.steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        probe_agent.log(loss=loss)
    agent = current()
    out = {"torch_before": TORCH_BEFORE, "agent": agent is not None}
    if agent is not None:
        agent.collectors.tracer.flush()
        agent.collectors.steps.flush(final=True)
        agent.store.flush()
        q = agent.store.query
        out["trace"] = q("SELECT step, stage, count(*) FROM torch_trace GROUP BY ALL "
                         "ORDER BY ALL").rows
        out["modules"] = q("SELECT DISTINCT module FROM torch_trace ORDER BY 1").rows
        out["steps"] = q("SELECT count(*) FROM steps").rows
        out["metrics"] = q("SELECT count(*) FROM metrics").rows
        out["state"] = agent.collectors.tracer.state()
    with open(args.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
