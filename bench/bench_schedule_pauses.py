"""What the throughput additions cost the training thread, measured side by side in one process:

1. ``model.train()`` with the pause meter's ``nn.Module.train`` wrapper installed against
   without it (the HF Trainer calls ``model.train()`` every step), arms interleaved in random
   order, ``--pairs`` pairs of ``--calls`` calls each, on a GPT-like model of ``--layers``
   blocks (about 12 modules a block): per call and per module.
2. ``torch.save`` of a small state dict with the save wrapper against without it, the same way.
3. One read of the schedule and of the parallel layout (ScheduleWatcher.read: discovery's heap
   walk and the scheduler description; parallel.layout), as done at steps 1, 10, 100, ...:
   the median of ``--reads`` reads, with transformers imported and its cosine schedule in use
   when transformers is installed (a realistic heap); the layout in a 1-rank gloo group (it
   walks the heap for DeviceMesh objects).

    .venv/bin/python bench/bench_schedule_pauses.py
    .venv/bin/python bench/bench_schedule_pauses.py --layers 12 --pairs 40
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from probe_agent.collectors.parallel import layout  # noqa: E402
from probe_agent.collectors.pauses import PauseMeter  # noqa: E402
from probe_agent.collectors.schedule import ScheduleWatcher  # noqa: E402


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d),
                                 nn.Dropout(0.1))


def timed(fn, n: int) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def paired(meter: PauseMeter, fn, pairs: int, calls: int) -> tuple[float, float]:  # noqa: ANN001
    on, off = [], []
    for _ in range(pairs):
        arms = ["on", "off"]
        random.shuffle(arms)
        for arm in arms:
            if arm == "on":
                meter.stopped = False
                meter.install()
                on.append(timed(fn, calls))
            else:
                meter.uninstall()
                off.append(timed(fn, calls))
    meter.uninstall()
    return statistics.median(on), statistics.median(off)


class _Clock:
    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.opt = opt

    def optimizers(self) -> list:
        return [self.opt]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--reads", type=int, default=7)
    a = p.parse_args()
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Embedding(512, 128), *(Block(128) for _ in range(a.layers)),
                          nn.Linear(128, 512))
    modules = sum(1 for _ in model.modules())
    meter = PauseMeter()
    on, off = paired(meter, model.train, a.pairs, a.calls)
    print(f"model.train() on {modules} modules: {off * 1e6:.1f} us without, {on * 1e6:.1f} us "
          f"with the wrapper: +{(on - off) * 1e6:.1f} us per call, "
          f"+{(on - off) / modules * 1e9:.0f} ns per module (x{on / off:.2f})")
    state = {k: v for k, v in list(model.state_dict().items())[:4]}
    on, off = paired(meter, lambda: torch.save(state, io.BytesIO()), a.pairs, 10)
    print(f"torch.save (small state, to memory): {off * 1e6:.1f} us without, {on * 1e6:.1f} us "
          f"with: +{(on - off) * 1e6:.1f} us")
    opt = torch.optim.AdamW(model.parameters())
    try:
        from transformers import get_cosine_schedule_with_warmup

        sched = get_cosine_schedule_with_warmup(opt, 100, 10_000)
    except ImportError:
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, 1e-3, total_steps=10_000)
    import torch.distributed as dist

    # a 1-process gloo group, so that the layout walks the heap for a DeviceMesh as in a job
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    watcher = ScheduleWatcher(_Clock(opt), 0)  # type: ignore[arg-type]
    reads, lays = [], []
    for _ in range(a.reads):
        t0 = time.perf_counter()
        rows = watcher.read(1, sys._getframe())
        reads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        layout()
        lays.append(time.perf_counter() - t0)
    import gc

    print(f"schedule read ({rows[0][3]}, {len(gc.get_objects()):,} gc objects): median "
          f"{statistics.median(reads) * 1e3:.1f} ms (min {min(reads) * 1e3:.1f}, max "
          f"{max(reads) * 1e3:.1f}); parallel layout: {statistics.median(lays) * 1e3:.1f} ms "
          f"(a heap walk for DeviceMesh, 1-rank gloo group); {type(sched).__name__} in use")


if __name__ == "__main__":
    main()
