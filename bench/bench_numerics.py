"""The cost of the numerics recorder (issue 40): the per-step capture (the loss from backward(),
the total gradient norm, the finite check: collectors/numerics.py, loss.py) and the per-module
statistics of traced steps (module_stats.py), as ratios against the same agent without them,
measured side by side in one process (both arms load the agent:
docs/decisions/measurement-method.md).

    .venv/bin/python bench/bench_numerics.py                       # ~5 ms and ~50 ms steps
    .venv/bin/python bench/bench_numerics.py --blocks 40 --steps 20

Design: blocks of ``--steps`` steps alternate between the arms in a shuffled order (paired:
slow drift on a busy machine hits both arms alike); each block's median step time is one
sample, and each pair of neighbouring blocks gives one ratio (on / off). Reported: the median
ratio with a 95% bootstrap interval over the pairs, and beside it ("inside") the share of the
"on" blocks' wall time spent inside the recorder's per-step entry points (class Inside), per
block, median and interval: on a noisy VM the ratio's interval is wider than the goal (0.5%),
the direct reading is not. Arms:

- capture: tracing off; numerics on vs off (``NumericsRecorder.set_active``);
- traced: every step traced (PROBE_TRACE=on); numerics on vs off: the per-module statistics
  (norms, the weight copy for the update ratio, the activation hook) against tracing alone.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.tracing_stats import bootstrap_median_ci  # noqa: E402


def workload(width: int, depth: int, batch: int):  # type: ignore[no-untyped-def]
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(width, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(batch, width), torch.randint(0, 10, (batch,))

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


class Inside:
    """Wall time spent inside the recorder's per-step entry points (its optimizer pre-hook's
    work, its step-boundary subscriber, the backward wrapper's loss capture): a direct reading
    of its own cost, beside the side-by-side ratio. A lower bound: what it does to caches and
    the allocator shows only in the ratio."""

    def __init__(self, rec) -> None:  # type: ignore[no-untyped-def]
        self.total = 0.0
        for owner, name in ((rec, "_begin"), (rec, "_on_step"), (rec.loss, "_seen")):
            setattr(owner, name, self._timed(getattr(owner, name)))

    def _timed(self, fn):  # type: ignore[no-untyped-def]
        def timed(*a, **kw):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.total += time.perf_counter() - t0
        return timed


def measure(step, rec, blocks: int, steps: int):  # type: ignore[no-untyped-def]
    """(median ratio, its 95% CI, median off step, median in-recorder share, its CI)."""
    inside = Inside(rec)
    shares = []
    rng = random.Random(0)
    for _ in range(steps):  # warm-up
        step()
    ratios, offs = [], []
    for _ in range(blocks):
        order = [True, False]
        rng.shuffle(order)
        med = {}
        for on in order:
            rec.set_active(on)
            step()  # the first step after a switch installs: not timed
            ts = []
            inside.total = 0.0
            for _ in range(steps):
                t0 = time.perf_counter()
                step()
                ts.append(time.perf_counter() - t0)
            med[on] = statistics.median(ts)
            if on:
                shares.append(inside.total / sum(ts))
        ratios.append(med[True] / med[False])
        offs.append(med[False])
    rec.set_active(True)
    return (statistics.median(ratios), bootstrap_median_ci(ratios), statistics.median(offs),
            statistics.median(shares), bootstrap_median_ci(shares))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--steps", type=int, default=15)
    args = ap.parse_args()
    os.environ.setdefault("PROBE_PORT", "0")
    import probe_agent
    from probe_agent.config import AgentConfig

    sizes = {"~5 ms": (256, 6, 64), "~50 ms": (1024, 6, 256)}
    print(f"{'workload':<8} {'arm':<8} {'step (off)':>10} {'ratio on/off':>13} {'95% CI':>18} "
          f"{'inside':>8} {'95% CI':>18}")
    for trace in ("off", "on"):
        agent = probe_agent.start(AgentConfig(port=0, trace=trace, watchdog=False,
                                              trace_native="off"))
        rec = agent.collectors.get("numerics")
        for label, (w, d, b) in sizes.items():
            step = workload(w, d, b)
            ratio, (lo, hi), off, share, (slo, shi) = measure(step, rec, args.blocks,
                                                                args.steps)
            arm = "capture" if trace == "off" else "traced"
            print(f"{label:<8} {arm:<8} {off * 1e3:>8.2f}ms {ratio:>13.4f} "
                  f"[{lo:.4f}, {hi:.4f}] {share:>8.4%} [{slo:.4%}, {shi:.4%}]", flush=True)
        probe_agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
