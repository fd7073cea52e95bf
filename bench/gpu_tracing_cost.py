"""The GPU check's tracing cost: tracing every module, and the default tracing, against tracing
off, on the GPU check's GPT (bench/gpu_gpt.py) at a step calibrated to ``--target-ms``
(bench/gpu_check.py runs it at ~10 ms and ~100 ms). One process under ``PROBE=1``: the arms
switch the agent's tracer between blocks of steps, interleaved round after round (the order
reversed every other round), so drift hits every arm alike; reported per arm, the median over
rounds of its block time over the same round's off block, with a 95% bootstrap interval
(bench/tracing_stats.py). A measurement: nothing is judged but that traced rows were written.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_gpt import Job, agent, query  # noqa: E402
from tracing_stats import bootstrap_median_ci  # noqa: E402


def run_cost(args: argparse.Namespace) -> list[dict[str, Any]]:
    a = agent()
    tracer = a.collectors.tracer
    default = a.config.__class__().trace
    batch = args.batch
    job = Job(args.device, batch)
    job.timed(3)
    while job.timed(3) * 1e3 < args.target_ms and batch < 4096:  # calibrate the step
        batch *= 2
        job = Job(args.device, batch)
        job.timed(2)
    arms = {"off": "off", "default": default, "every module": "on"}
    times: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(args.rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for arm in order:
            tracer.set_mode(arms[arm])
            job.timed(2)  # a new mode applies from the next step boundary
            times[arm].append(job.timed(args.block))
    step_ms = statistics.median(times["off"]) * 1e3
    out: list[dict[str, Any]] = [{"name": "calibrated step", "ok": None, "batch": batch,
                                  "off_ms": round(step_ms, 2), "target_ms": args.target_ms}]
    for arm in ("default", "every module"):
        ratios = [x / o for x, o in zip(times[arm], times["off"])]
        lo, hi = bootstrap_median_ci(ratios)
        out.append({"name": f"tracing {arm} / off at ~{args.target_ms:g} ms", "ok": None,
                    "median_ratio": round(statistics.median(ratios), 4),
                    "ci95": [round(lo, 4), round(hi, 4)], "rounds": args.rounds,
                    "steps_per_block": args.block, "mode": arms[arm]})
    rows = query(a.url, "SELECT count(*) FROM python.torch_trace")
    out.append({"name": "traced rows were written", "ok": bool(rows and rows[0][0] > 0)})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=16, help="the first batch the calibration tries")
    p.add_argument("--target-ms", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--block", type=int, default=10, help="steps per arm per round")
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    results = run_cost(args)
    Path(args.out, "result.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
