"""A 2-rank FSDP2 job where only some ranks run the agent (``--agent-ranks 0``: `probe attach`
to one rank, or PROBE=1 on some nodes only), or where one rank's agent stops mid-run
(``--stop-agent-at N`` on the last rank), or where the last rank's agent starts after the others'
(``--agent-from N``: after its step N, as `probe inject` or a late writer tick would). The agent
must never add a collective that a peer does not make: the job finishes its steps and prints,
per rank with an agent, ``PARTIAL {"rank", "steps", "on", "sharded", "norms"}`` (whether the
ranks agreed at some step, the numerics recorder's agreement state, and the gradient norm it
recorded at each step).

Run: ``torchrun --nproc-per-node=2 tests/programs/fsdp2_partial_agent.py --agent-ranks 0``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--agent-ranks", default="0", help="comma-separated ranks that start it")
    p.add_argument("--stop-agent-at", type=int, default=0,
                   help="the last rank stops its agent after this step (0: never)")
    p.add_argument("--agent-from", type=int, default=0,
                   help="the last rank starts its agent after this step (0: at the start)")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    agent = None
    late = args.agent_from if rank == world - 1 else 0
    if str(rank) in args.agent_ranks.split(",") and not late:
        agent = start_agent()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    recorder = agent.collectors.numerics if agent is not None else None
    seen_on = False
    norms: dict[int, float | None] = {}
    for step in range(1, args.steps + 1):
        x = torch.randn(8, 16, generator=g)
        nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
        opt.zero_grad()
        if recorder is not None:
            sharded = recorder.sharded
            seen_on = seen_on or bool(getattr(sharded, "on", False))
            norms[step] = recorder.last.get("grad_norm")
        if late and step == late and str(rank) in args.agent_ranks.split(","):
            agent = start_agent()
            recorder = agent.collectors.numerics
        if args.stop_agent_at and step == args.stop_agent_at and rank == world - 1 and \
                agent is not None:
            import probe_agent

            probe_agent.stop()
    if recorder is not None:
        state = recorder.sharded.state() if hasattr(recorder.sharded, "state") else None
        print("PARTIAL " + json.dumps({"rank": rank, "steps": args.steps, "on": seen_on,
                                       "sharded": state, "norms": norms}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def start_agent() -> Any:
    os.environ["PROBE_PORT"] = "0"
    import probe_agent

    return probe_agent.start()


if __name__ == "__main__":
    main()
