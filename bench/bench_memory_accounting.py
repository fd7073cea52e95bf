"""Memory accounting's cost on traced steps: tracing with saved-bytes accounting against tracing
without it (issue 29), side by side in one agent.

The GPT of bench_tracing.py (small: ~30 ms CPU steps; large: ~200 ms), every step traced, three
arms interleaved round after round in blocks (ABC ABC ...), so the machine's drift hits them
alike:

- ``untraced``: the agent running, tracing off (for scale);
- ``traced``: every module traced, the saved-tensor and input hooks off;
- ``accounted``: every module traced with the accounting: the saved_tensors_hooks pack hook,
  the global forward pre-hook for inputs, and the parameter/gradient/optimizer count per step.

Reported per size: the median over rounds of each block's mean training-thread CPU time per
step, and the paired ratios (median over rounds, 95% bootstrap interval): ``accounted/traced``
(the accounting's cost on a traced step: the number the tracing budget is about) and
``traced/untraced`` (tracing's own, for scale). The default mode traces every 10th step, so a
job pays about a tenth of the first ratio's excess.

Usage: python bench/bench_memory_accounting.py [--sizes small,large] [--rounds N] [--native off]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import tracing_workload as wl  # noqa: E402
from tracing_stats import bootstrap_median_ci  # noqa: E402


def _block(loop: wl.Loop, agent: object, arm: str, n: int) -> float:
    tracer = agent.collectors.tracer  # type: ignore[attr-defined]
    tracer.saved.enabled = arm == "accounted"
    tracer.set_mode("off" if arm == "untraced" else "on")
    loop.steps(2)  # the arm takes effect at a step boundary: settle first
    tt = time.thread_time
    t0 = tt()
    loop.steps(n)
    return (tt() - t0) / n


def run_size(size: str, rounds: int | None) -> dict[str, object]:
    loop = wl.Loop(size)
    agent = wl.start_agent("on")
    try:
        loop.steps(5)
        arms = ("untraced", "traced", "accounted")
        res: dict[str, list[float]] = {a: [] for a in arms}
        for _ in range(rounds or loop.rounds):
            for arm in arms:
                res[arm].append(_block(loop, agent, arm, loop.block))
        tracer = agent.collectors.tracer  # type: ignore[attr-defined]
        failures = tracer.saved.failures
    finally:
        wl.stop_agent()

    def paired(a: str, b: str) -> dict[str, object]:
        r = [x / y for x, y in zip(res[a], res[b])]
        lo, hi = bootstrap_median_ci(r)
        return {"ratio": round(statistics.median(r), 4), "ci95": [round(lo, 4), round(hi, 4)]}

    return {
        "size": size, "rounds": len(res["traced"]), "block_steps": loop.block,
        "module_calls_per_step": loop.calls,
        "step_ms": {a: round(1e3 * statistics.median(v), 3) for a, v in res.items()},
        "accounted_over_traced": paired("accounted", "traced"),
        "traced_over_untraced": paired("traced", "untraced"),
        "accounting_failures": failures,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--native", choices=["auto", "off"], default="auto")
    a = p.parse_args()
    wl.NATIVE = a.native
    torch.set_num_threads(1)
    path = wl.load_native()
    for size in a.sizes.split(","):
        out = run_size(size, a.rounds)
        out["hot_path"] = path
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
