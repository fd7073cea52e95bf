"""A 2-rank FSDP2 job where only some ranks run the agent (``--agent-ranks 0``: `probe attach`
to one rank, or PROBE=1 on some nodes only), or where one rank's agent stops mid-run
(``--stop-agent-at N`` on the last rank). The agent must never add a collective that a peer
does not make: the job finishes its steps and prints, per rank with an agent,
``PARTIAL {"rank", "steps", "sharded", "off"}`` (the numerics recorder's agreement state).

Run: ``torchrun --nproc-per-node=2 tests/programs/fsdp2_partial_agent.py --agent-ranks 0``.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--agent-ranks", default="0", help="comma-separated ranks that start it")
    p.add_argument("--stop-agent-at", type=int, default=0,
                   help="the last rank stops its agent after this step (0: never)")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    agent = None
    if str(rank) in args.agent_ranks.split(","):
        os.environ["PROBE_PORT"] = "0"
        import probe_agent

        agent = probe_agent.start()
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
    for step in range(1, args.steps + 1):
        x = torch.randn(8, 16, generator=g)
        nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
        opt.zero_grad()
        seen_on = seen_on or bool(recorder is not None and recorder._sharded)
        if args.stop_agent_at and step == args.stop_agent_at and rank == world - 1 and \
                agent is not None:
            import probe_agent

            probe_agent.stop()
    if recorder is not None:
        print("PARTIAL " + json.dumps({"rank": rank, "steps": args.steps, "on": seen_on,
                                       "sharded": recorder._sharded,
                                       "off": getattr(recorder, "sharded_off", None)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
