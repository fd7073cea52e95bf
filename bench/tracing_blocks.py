"""bench_tracing.py's arms that alternate whole configurations, each in blocks of steps: the
default run (no agent / agent off / on / default / torch.profiler, interleaved), ``--hot-path``
(the training thread's cost by low quantiles), ``--per-call`` (100 tiny layers) and ``--rss``
(memory over a long run). The randomised per-step arms: tracing_paired.py.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn as nn
import tracing_workload as workload
from tracing_stats import bootstrap_median_ci, rss_mib
from tracing_workload import Loop, start_agent, stop_agent


def run_size(size: str, rounds: int | None, block: int | None = None) -> dict[str, object]:
    loop = Loop(size)
    n = block or loop.block
    rounds = rounds or loop.rounds
    configs = ["baseline", "agent-off", "on", "default", "profiler"]
    res: dict[str, list[tuple[float, ...]]] = {c: [] for c in configs}
    loop.steps(5)  # warm-up
    agent = None
    began = time.perf_counter()
    for r in range(rounds):
        # Alternate the order (agent configs first or last) so that neither side always runs
        # right after an agent start or stop.
        order = configs if r % 2 == 0 else [*configs[1:], configs[0]]
        if r % 4 >= 2:
            order = [order[-1], *order[:-1]]
        for c in order:
            if c in ("baseline", "profiler"):
                if agent is not None:
                    stop_agent()
                    agent = None
                    loop.steps(3)
                if c == "baseline":
                    res[c].append(loop.steps(n))
                else:
                    from torch.profiler import ProfilerActivity, profile

                    with profile(activities=[ProfilerActivity.CPU]):
                        res[c].append(loop.steps(n))
                continue
            if agent is None:
                agent = start_agent("off")
                time.sleep(0.5)  # let the agent's threads finish starting (not measured)
                loop.steps(3)
            tracer = agent.collectors.tracer
            mode = {"agent-off": "off", "on": "on"}.get(c, agent.config.__class__().trace)
            tracer.set_mode(mode)
            loop.steps(1)  # a new mode applies from the next step boundary
            # align so that a block of n (a multiple of 10) holds n/10 sampled steps
            while (agent.stepclock.current_step + 1) % 10 != 1:
                loop.steps(1)
            res[c].append(loop.steps(n))
        took = time.perf_counter() - began
        print(f"  {size} round {r + 1}/{rounds} (t={took:.0f} s): " + ", ".join(
            f"{c} {res[c][-1][0] * 1e3:.1f}" for c in configs), file=sys.stderr, flush=True)
    if agent is not None:
        stop_agent()
    base = res["baseline"]
    out: dict[str, object] = {"size": size, "module_calls_per_step": loop.calls,
                              "steps_per_block": n, "rounds": rounds}
    q = statistics.quantiles
    out["baseline_block_spread"] = round(  # how noisy this machine was: (p90 - p10) / median
        (q([x[0] for x in base], n=10)[-1] - q([x[0] for x in base], n=10)[0])
        / statistics.median(x[0] for x in base), 3)
    for c in configs:
        rows = res[c]
        paired = [x[0] / b[0] for x, b in zip(rows, base)]
        lo, hi = bootstrap_median_ci(paired)
        out[c] = {
            "cpu_ms": round(statistics.median(x[0] for x in rows) * 1e3, 2),
            "wall_ms": round(statistics.median(x[1] for x in rows) * 1e3, 2),
            # median of the rounds' paired ratios, and its 95% bootstrap interval
            "ratio_cpu": round(statistics.median(paired), 4),
            "ratio_cpu_ci95": [round(lo, 4), round(hi, 4)],
            # ratio of the lower quartiles: noise on a shared VM only ever adds time
            "ratio_cpu_p25": round(q([x[0] for x in rows], n=4)[0]
                                   / q([x[0] for x in base], n=4)[0], 4),
            "ratio_wall": round(statistics.median(x[1] / b[1] for x, b in zip(rows, base)), 4),
            "process_cpu_ms": round(statistics.median(x[4] for x in rows) * 1e3, 2),
            "ratio_process_cpu": round(
                statistics.median(x[4] / b[4] for x, b in zip(rows, base)), 4),
            "full_gc_runs": sum(x[5] for x in rows),
            "gc_ms_per_step": round(sum(x[6] for x in rows) / (len(rows) * n), 3),
        }
    on = res["on"]
    dfwd = statistics.median(x[2] - b[2] for x, b in zip(on, base))
    dbwd = statistics.median(x[3] - b[3] for x, b in zip(on, base))
    # every module call has a forward row; backward rows: modules whose output has a grad_fn
    # (all of them here), so the same count
    out["us_per_module_call_forward"] = round(dfwd / loop.calls * 1e6, 2)
    out["us_per_module_call_backward"] = round(dbwd / loop.calls * 1e6, 2)
    return out


def run_hot_path(size: str, reps: int) -> dict[str, object]:
    """The training thread's own cost per traced step, by quantiles: tracing off, on with the
    Python hot path and (when it loaded) on with the C++ one alternate every 4 steps in one
    agent, forward and backward timed apart (thread CPU), and the low quantiles (min, p10, p50)
    compared, since noise on a shared machine only adds time. The writer's cost is not in here
    (see --paired)."""
    loop = Loop(size)
    loop.steps(5)
    agent = start_agent("off")
    tracer = agent.collectors.tracer
    time.sleep(0.5)
    modes = ["off", "python"] + (["native"] if workload.NATIVE != "off" else [])
    got: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for _ in range(reps):
        for mode in modes:
            tracer.native_mode = "off" if mode == "python" else workload.NATIVE
            tracer.set_mode("off" if mode == "off" else "on")
            loop.steps(1)  # the mode applies from the next step
            for _ in range(3):
                x = loop.steps(1)
                got[mode].append((x[2], x[3]))  # forward, backward thread time
    stop_agent()
    out: dict[str, object] = {"size": size, "steps_per_mode": len(got["off"]),
                              "module_calls_per_step": loop.calls}
    for i, stage in enumerate(("forward", "backward")):
        q = {m: sorted(x[i] for x in v) for m, v in got.items()}
        for name, k in (("min", 0), ("p10", len(q["off"]) // 10), ("p50", len(q["off"]) // 2)):
            out[f"{stage}_{name}_ms_off"] = round(q["off"][k] * 1e3, 3)
            for mode in modes[1:]:
                d = q[mode][k] - q["off"][k]
                out[f"{stage}_{name}_ms_added_{mode}"] = round(d * 1e3, 3)
                out[f"{stage}_{name}_us_per_call_{mode}"] = round(d / loop.calls * 1e6, 2)
    return out


def run_per_call(reps: int = 30) -> dict[str, object]:
    """Cost per module call: 100 tiny Linear layers in a Sequential (the model's own work is
    small, so the tracer's share is visible), trace on vs off in one agent, alternating blocks;
    forward alone, then forward + backward."""
    seq = nn.Sequential(*[nn.Linear(8, 8) for _ in range(100)])
    x = torch.zeros(2, 8, requires_grad=True)
    opt = torch.optim.SGD(seq.parameters(), lr=0.0)
    agent = start_agent("off")
    time.sleep(0.5)
    tracer = agent.collectors.tracer
    tt = time.thread_time
    fw: dict[str, list[float]] = {"off": [], "on": []}
    bw: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(reps):
        for mode in ("off", "on"):
            tracer.set_mode(mode)
            opt.step()  # the step boundary applies the mode
            t = tt()
            for _ in range(10):
                seq(x)
            fw[mode].append((tt() - t) / 10 / 101)
            t = tt()
            for _ in range(10):
                seq(x).sum().backward()
            bw[mode].append((tt() - t) / 10 / 101 - fw[mode][-1])
            opt.step()
    stop_agent()
    med = statistics.median
    return {"module_calls": 101,
            "forward_us_per_call_off": round(med(fw["off"]) * 1e6, 2),
            "forward_us_added_per_call": round((med(fw["on"]) - med(fw["off"])) * 1e6, 2),
            "backward_us_per_call_off": round(med(bw["off"]) * 1e6, 2),
            "backward_us_added_per_call": round((med(bw["on"]) - med(bw["off"])) * 1e6, 2)}


def run_rss(steps: int, mode: str, retention_mb: int) -> dict[str, object]:
    loop = Loop("small")
    agent = start_agent(mode, retention_mb)
    marks: dict[int, float] = {}
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        loop.steps(1)
        if i % 1000 == 0:
            marks[i] = round(rss_mib(), 1)
            n = agent.store.query("SELECT count(*) FROM torch_trace").rows[0][0]
            print(f"  step {i}: rss {marks[i]} MiB, torch_trace rows {n}, "
                  f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    stop_agent()
    first = marks.get(1000)
    return {"mode": mode, "retention_mb": retention_mb, "rss_mib": marks,
            "rss_10k_over_1k": round(marks[max(marks)] / first, 3) if first else None}
