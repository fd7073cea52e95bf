"""Torch-tracing overhead, side by side in one process (issue 3).

A GPT-style transformer (>=100 modules: 8 blocks of ln/attn(c_attn, c_proj, drop)/ln/mlp(c_fc,
act, c_proj, drop), embeddings, head), forward + backward + AdamW, at two sizes: ``small`` (~30 ms
CPU step) and ``large`` (~200 ms). Configurations run interleaved, round after round (ABCDE
ABCDE ...), so drift and the neighbours' load hit all of them alike:

- ``baseline``: no agent;
- ``agent-off``: the agent running with PROBE_TRACE=off;
- ``on``: every module on every step;
- ``default``: the default mode (PROBE_TRACE unset: every:10);
- ``profiler``: torch.profiler (CPU activities) around the same loop, no agent.

Each block is a multiple of 10 steps. Reported: per configuration the median over rounds of the
block's mean step time, and the median over rounds of the ratio to that round's baseline
(paired ratios: robust to drift) with its 95% bootstrap interval, the ratio of the lower
quartiles (noise on a shared VM only adds time), in three clocks: the training thread's CPU time
(``thread_time``, which other processes on shared cores inflate least), the whole process's CPU
time (``process_time``: includes the agent's writer thread, the honest total cost) and wall;
plus the full GC collections and the GC time per step in each configuration's blocks (a full
collection of a big process is a pause every step pays), and ``baseline_block_spread``, the
(p90 - p10) / median of the baseline blocks: how noisy the machine was during the run.
Per-module-call cost: the extra forward (and backward) thread time of ``on`` over ``baseline``
divided by the module calls (and backward rows) per step; ``--per-call`` measures it more
precisely on 100 tiny layers.

``--rss``: the process RSS after 1k and 10k steps of the small model with the agent on (mode and
retention from --rss-mode / --retention-mb), to show that memory stays flat.

``--paired STEPS`` (the precise one on a noisy machine): in one agent, a seeded coin decides
before every step whether the next one is untraced, traced (every module) on the Python hot path,
or traced on the C++ one (``--native off``: no C++), so the machine's swings hit every kind
alike; a least-squares fit of each step's training-thread CPU time (detrended by a moving
median) on "this step's kind" and "the previous step's kind" gives the cost of tracing a step on
each path, with a moving-block bootstrap interval. Beside it: the CPU of the agent's own threads per
traced step, the training thread's extra time off the CPU (GIL waits) per traced step, the cost
of a mode change, and the optimizer hooks' cost with tracing off. The same fit on winsorized
steps (``robust_*``: stalls beyond 4 robust SDs clipped, counted per kind) narrows the interval
where a few stalled steps widened it. Reported ratios: ``measured_*``
(training thread's CPU + its waits) and ``estimate_*`` (an upper bound: every agent-thread
microsecond charged to the training thread).

Usage: python bench/bench_tracing.py [--sizes small,large] [--rounds N] [--threads 1]
       python bench/bench_tracing.py --paired 3000 --sizes small
       python bench/bench_tracing.py --floor 3000 --sizes mlp,tiny
       python bench/bench_tracing.py --per-call
       python bench/bench_tracing.py --hot-path 60 [--sizes small,large]
       python bench/bench_tracing.py --rss [--rss-steps 10000]

The parts: tracing_workload.py (the model, the timed loop, the agent), tracing_blocks.py (the
block arms and --rss), tracing_paired.py (--paired, --floor), tracing_stats.py (the fits and
intervals); this file is the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

# The parts are modules beside this file; python -m bench.bench_tracing finds them too.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tracing_workload as workload  # noqa: E402
from tracing_blocks import run_hot_path, run_per_call, run_rss, run_size  # noqa: E402
from tracing_paired import run_floor, run_paired  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--block", type=int, default=None,
                   help="steps per block (default 10; longer blocks average out short noise)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1 leaves the 2nd core to the agent's threads)")
    p.add_argument("--paired", type=int, default=0, metavar="STEPS",
                   help="step-level pairs instead of blocks (every:2 in one agent), plus the "
                        "agent's own thread CPU and its per-step hook cost")
    p.add_argument("--per-call", action="store_true",
                   help="only the per-module-call cost (100 tiny Linear layers)")
    p.add_argument("--hot-path", type=int, default=0, metavar="REPS",
                   help="only the training thread's cost: off/on alternating, low quantiles")
    p.add_argument("--floor", type=int, default=0, metavar="STEPS",
                   help="torch's own cost of the hooks tracing needs, with empty hooks")
    p.add_argument("--native", choices=["auto", "off"], default="auto",
                   help="the tracer's hot path: auto = C++ (built first if needed), off = Python")
    p.add_argument("--paths", default="python,native",
                   help="--paired: the hot paths to compare with untraced steps (fewer paths, "
                        "more steps each)")
    p.add_argument("--rss", action="store_true")
    p.add_argument("--rss-steps", type=int, default=10_000)
    p.add_argument("--rss-mode", default="on")
    p.add_argument("--retention-mb", type=int, default=32)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    workload.NATIVE = args.native
    workload.PATHS = [p for p in args.paths.split(",") if p in ("python", "native")]
    print(f"hot path: {workload.load_native()}", file=sys.stderr)
    if args.per_call:
        print(json.dumps(run_per_call(), indent=1))
        return
    if args.hot_path:
        print(json.dumps([run_hot_path(s, args.hot_path) for s in args.sizes.split(",")],
                         indent=1))
        return
    if args.floor:
        print(json.dumps([run_floor(s, args.floor) for s in args.sizes.split(",")], indent=1))
        return
    if args.paired:
        out = [run_paired(s, args.paired) for s in args.sizes.split(",")]
        print(json.dumps(out, indent=1))
        return
    if args.rss:
        print(json.dumps(run_rss(args.rss_steps, args.rss_mode, args.retention_mb), indent=1))
        return
    results = [run_size(s, args.rounds, args.block) for s in args.sizes.split(",")]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
