"""What the collective-fault recorders cost the training thread, measured side by side in one
process (every arm loads the agent's modules; blocks alternate, so load drifts hit every arm):

- **unused parameters** (probe_agent/collectors/unused_params.py), per optimizer step of a
  6-layer width-256 MLP: ``off`` (no hook), ``untraced`` (the hook installed, past the first
  steps, step not traced: it returns after two attribute reads), ``recorded`` (every step
  recorded, as on a traced step: a scan of the optimizer's parameters);
- **the collectives' black box** (collective_strip.py), per explicit ``all_reduce`` of one
  scalar on a 1-rank gloo group: the recorder's wrapper without and with the strip.

    .venv/bin/python bench/bench_collective_costs.py [--blocks 12] [--steps 300] [--calls 2000]

Prints, per arm, the median per-step (per-call) time over blocks and the ratio to the baseline
with its interquartile range over the paired blocks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

from probe_agent.collectors.collectives import CollectiveRecorder  # noqa: E402
from probe_agent.collectors.unused_params import UnusedParams  # noqa: E402


class Traced:
    """Stands for the tracer's one attribute the hook reads (a traced step or not)."""

    def __init__(self, recording: bool) -> None:
        self.recording = recording
        self.root = None


class Clock:
    current_step = 0


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def step_block(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def bench_unused(blocks: int, steps: int) -> None:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 256)
    import torch.optim.optimizer as optmod

    from probe_agent import optim_hooks

    untraced = UnusedParams(Clock(), 0, Traced(False))
    untraced._left = 0  # past the first steps
    recorded = UnusedParams(Clock(), 0, Traced(True))
    recorded._flag_read = True  # the one-time heap walk is not a per-step cost
    arms: dict[str, list[float]] = {"off": [], "untraced": [], "recorded": []}
    step_block(model, opt, x, steps)  # warm-up
    for _ in range(blocks):
        for name in arms:
            hook = None
            if name != "off":
                c = untraced if name == "untraced" else recorded
                hook = optim_hooks.register(optmod, "pre", c._pre_step)
            arms[name].append(step_block(model, opt, x, steps))
            if hook is not None:
                hook.remove()
            recorded.rows.clear()
    report("unused parameters, per optimizer step (6x256 MLP, batch 32)", arms, "off")


def bench_strip(blocks: int, calls: int) -> None:
    store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    rec = CollectiveRecorder(0)
    rec._install(sys.modules["torch.distributed.distributed_c10d"], dist)
    t = torch.ones(())
    arms: dict[str, list[float]] = {"wrapper": [], "wrapper+strip": []}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "collectives.strip")
        for _ in range(blocks):
            for name in arms:
                if name == "wrapper+strip":
                    rec.attach_strip(path)
                t0 = time.perf_counter()
                for _ in range(calls):
                    dist.all_reduce(t)
                arms[name].append((time.perf_counter() - t0) / calls)
                if rec.strip is not None:
                    rec.strip.close()
                    rec.strip = None
                rec.records.clear()
    dist.destroy_process_group()
    report("explicit all_reduce of a scalar, per call (1-rank gloo)", arms, "wrapper")


def report(title: str, arms: dict[str, list[float]], base: str) -> None:
    print(f"\n{title}")
    for name, xs in arms.items():
        lo, med, hi = quartiles(xs)
        line = f"  {name:<14} median {med * 1e6:9.1f} us  (quartiles {lo * 1e6:.1f}-{hi * 1e6:.1f})"
        if name != base:
            ratios = [a / b for a, b in zip(xs, arms[base])]
            rlo, rmed, rhi = quartiles(ratios)
            line += f"  ratio to {base}: {rmed:.3f} (quartiles {rlo:.3f}-{rhi:.3f})"
        print(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    bench_unused(args.blocks, args.steps)
    bench_strip(args.blocks, args.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
