"""bench_tracing.py's randomised arms, the precise ones on a noisy machine: before every step a
seeded coin picks how the next one runs, and a least-squares fit (tracing_stats.py) gives each
kind's cost. ``--paired``: untraced / Python hot path / C++ hot path in one agent, with the
agent's own threads and the optimizer hooks' cost (``run_hooks_cost``) beside it; ``--floor``:
what torch charges for the hooks tracing needs, with empty hooks and no tracer.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.nn as nn
import tracing_workload as workload
from tracing_stats import fit_effects, thread_cpu_s, toggle_cost
from tracing_workload import Loop, start_agent, stop_agent


def run_paired(size: str, steps: int) -> dict[str, object]:
    """Randomised steps in one agent: before each step a coin picks how the *next* step runs:
    untraced, traced on the Python hot path, or traced on the C++ one (when it loaded), so
    drift and the neighbours' load hit every kind alike, and a least-squares fit of each step's
    time on "this step's kind" and "the previous step's kind" gives the cost of tracing a step
    on each path, including what a traced step leaves to the next one.

    The agent's own threads (the writer that turns rows into Arrow and DuckDB, the HTTP
    server, discovery) are accounted separately: their CPU per traced step (both paths
    together), over an equal run with tracing off, is added in full to the training thread's
    cost as if every microsecond of it held the GIL the training thread needed (an upper bound:
    DuckDB's insert releases the GIL). Estimates: ``on`` (every module every step), ``default``
    (every:10, 1/10 of that) and ``off`` (the optimizer hooks and the idle agent threads)."""
    import random

    loop = Loop(size)
    loop.steps(5)
    agent = start_agent("off")
    tracer = agent.collectors.tracer
    time.sleep(0.5)
    loop.steps(5)
    agent.store.flush()
    # the idle agent's threads, over steps with tracing off (before and after the random run)
    cpu0, w0 = thread_cpu_s("probe-agent"), time.perf_counter()
    idle = [loop.steps(1) for _ in range(steps // 8)]
    idle_cpu = thread_cpu_s("probe-agent") - cpu0
    idle_wall = time.perf_counter() - w0
    paths = [p for p in workload.PATHS if p == "python" or workload.NATIVE != "off"]
    rng = random.Random(1)

    def coin() -> None:  # set now, applies at this step's optimizer.step(): the next step
        k = rng.randrange(len(paths) + 1)
        tracer.native_mode = "off" if k and paths[k - 1] == "python" else workload.NATIVE
        tracer.set_mode("on" if k else "off")

    labels: list[int] = []
    times: list[tuple[float, ...]] = []
    # The FLOP meter (collectors/flops.py) runs one step under FlopCounterMode: with tracing off
    # at the agent's start that was one of the warm-up steps above. Any step it measures in the
    # run (new input shapes) is flagged and left out of every fit.
    meter = agent.collectors.steps.throughput.meter
    flop_before = meter.measurements
    flop_steps: set[int] = set()
    load0 = os.getloadavg()
    coin()
    loop.steps(1)  # the first coin's step starts
    cpu0 = thread_cpu_s("probe-agent")
    for i in range(steps):
        coin()
        labels.append(0 if not tracer.recording
                      else paths.index("native" if tracer.on_native else "python") + 1)
        m0 = meter.measurements
        times.append(loop.steps(1))
        if meter.measurements != m0 or meter._mode is not None:
            flop_steps.add(i)
    load1 = os.getloadavg()
    tracer.set_mode("off")
    loop.steps(1)
    agent.store.flush()
    random_cpu = thread_cpu_s("probe-agent") - cpu0
    cpu0, w0 = thread_cpu_s("probe-agent"), time.perf_counter()
    idle += [loop.steps(1) for _ in range(steps // 8)]
    idle_cpu += thread_cpu_s("probe-agent") - cpu0
    idle_wall += time.perf_counter() - w0
    idle_cpu_per_step = idle_cpu / len(idle)
    idle_share = idle_cpu / idle_wall
    agent_cpu = random_cpu - idle_cpu_per_step * (steps + 1)
    traced = sum(1 for lab in labels if lab)
    rows_per_traced = agent.store.query(
        "SELECT count(*) FROM torch_trace").rows[0][0] / max(1, traced)
    stop_agent()
    base = statistics.median(t[0] for t, lab in zip(times, labels) if not lab)
    base_wall = statistics.median(t[1] for t, lab in zip(times, labels) if not lab)
    kinds = len(paths)
    skip = frozenset(flop_steps)
    cpu = fit_effects([t[0] for t in times], labels, kinds, skip=skip)
    robust = fit_effects([t[0] for t in times], labels, kinds, robust=True, skip=skip)
    wall = fit_effects([t[1] for t in times], labels, kinds, robust=True, skip=skip)
    fwd = fit_effects([t[2] for t in times], labels, kinds, reps=0, skip=skip)
    bwd = fit_effects([t[3] for t in times], labels, kinds, reps=0, skip=skip)
    writer = agent_cpu / traced
    hooks = run_hooks_cost()
    off_s = hooks["added_us_per_step"] * 1e-6 + idle_cpu_per_step
    # every:10 changes mode twice per 10 steps (measured as the cost of a switch)
    toggle = max(toggle_cost([t[0] for t in times], labels, skip), 0.0)
    toggles = 2 * toggle / 10

    def ratio(x: float) -> float:
        return round(1 + x / base, 4)

    out: dict[str, object] = {
        "size": size, "steps": steps, "traced_steps": traced,
        "load_average_1min": [round(load0[0], 2), round(load1[0], 2)],
        "flop_meter": {"measured_step": meter.measured_step,
                       "measured_in_warmup": flop_before, "measured_in_run_left_out":
                       len(flop_steps)},
        "untraced_step_wall_ms": round(base_wall * 1e3, 2),
        "module_calls_per_step": loop.calls, "rows_per_traced_step": round(rows_per_traced, 1),
        "untraced_step_cpu_ms": round(base * 1e3, 2),
        "agent_threads_ms_per_traced_step": round(writer * 1e3, 3),
        "mode_change_ms": round(toggle * 1e3, 3),
        "estimate_off": ratio(off_s),
        "off_parts_us_per_step": {"optimizer_hooks": hooks["added_us_per_step"],
                                  "idle_agent_threads": round(idle_cpu_per_step * 1e6, 1)},
        "idle_agent_threads_cpu_share": round(idle_share, 4),
    }
    for k, path in enumerate(paths):
        c = cpu[k]
        # The training thread's time off the CPU (waiting for the GIL, or preempted) in this
        # path's traced steps, against the idle agent's steps.
        mine = [t for t, lab in zip(times, labels) if lab == k + 1]
        wait = (statistics.fmean(t[1] - t[0] for t in mine)
                - statistics.fmean(t[1] - t[0] for t in idle))
        measured = c["total"] + max(wait, 0.0)
        out[path] = {
            "steps": len(mine),
            "training_thread_ms_per_traced_step": {
                "direct": round(c["direct"] * 1e3, 3), "next_step": round(c["carry"] * 1e3, 3),
                "total": round(c["total"] * 1e3, 3),
                "ci95": [round(v * 1e3, 3) for v in c["ci95"]],
                "wall_total": round(wall[k]["total"] * 1e3, 3),
                # the same fit on winsorized steps; clipped_high: [untraced, this path] steps
                "robust_total": round(robust[k]["total"] * 1e3, 3),
                "robust_ci95": [round(v * 1e3, 3) for v in robust[k]["ci95"]],
                "clipped_high": robust[k]["clipped_high"]},
            "training_thread_wait_ms_per_traced_step": round(wait * 1e3, 3),
            # The headline ratios, each over the untraced steps' median of the same clock,
            # from the randomised fit (winsorized): the training thread's CPU; its wall time
            # (GIL waits and preemption included); and the CPU ratio with every agent-thread
            # microsecond per traced step added (an upper bound).
            "ratio_thread_cpu": ratio(robust[k]["total"]),
            "ratio_thread_cpu_ci95": [ratio(v) for v in robust[k]["ci95"]],
            "ratio_wall": round(1 + wall[k]["total"] / base_wall, 4),
            "ratio_wall_ci95": [round(1 + v / base_wall, 4) for v in wall[k]["ci95"]],
            "ratio_cpu_with_agent_threads": ratio(robust[k]["total"] + writer),
            "us_per_module_call_forward": round(fwd[k]["total"] / loop.calls * 1e6, 2),
            "us_per_module_call_backward": round(bwd[k]["total"] / loop.calls * 1e6, 2),
            # measured: the training thread's own extra CPU plus its extra time off the CPU
            "measured_on": ratio(measured),
            "measured_on_robust": ratio(robust[k]["total"] + max(wait, 0.0)),
            "measured_default_every10": ratio(measured / 10 + toggles
                                              + hooks["added_us_per_step"] * 1e-6),
            # bound: every agent-thread microsecond charged to the training thread
            "estimate_on": ratio(c["total"] + writer),
            "estimate_on_ci95": [ratio(v + writer) for v in c["ci95"]],
            "estimate_on_robust_ci95": [ratio(v + writer) for v in robust[k]["ci95"]],
            "estimate_default_every10": ratio((c["total"] + writer) / 10 + toggles + off_s),
            "estimate_default_ci95": [ratio((v + writer) / 10 + toggles + off_s)
                                      for v in c["ci95"]],
        }
    return out


def run_floor(size: str, steps: int) -> dict[str, object]:
    """What torch and Python charge for the hooks the tracer needs, with empty hooks and no
    tracer (the agent loaded, tracing off), by the same coin and fit as ``--paired``: a step
    with an empty ``saved_tensors_hooks`` pair (pack returns ``t.detach()``, as the saved-bytes
    counter must; unpack returns it), a step with ``nn.Module.__call__`` replaced by a Python
    function that only calls ``_call_impl`` (the frame the native path's shim keeps for
    dynamo), and a step with both. Per saved tensor, autograd then calls Python twice."""
    import random

    loop = Loop(size)
    loop.steps(5)
    start_agent("off")
    time.sleep(0.5)
    loop.steps(5)
    orig = nn.Module.__call__

    def shim(self: nn.Module, *args: object, **kwargs: object) -> object:
        return self._call_impl(*args, **kwargs)

    hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach(), lambda t: t)
    kinds = ["saved_tensors_hooks", "python_call_shim", "both"]
    rng = random.Random(2)
    labels: list[int] = []
    times: list[tuple[float, ...]] = []
    saved = 0

    def count(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        loop.steps(1)
    saved_per_step = saved
    load0 = os.getloadavg()
    for _ in range(steps):
        k = rng.randrange(len(kinds) + 1)
        labels.append(k)
        if k in (2, 3):
            nn.Module.__call__ = shim  # type: ignore[method-assign]
        try:
            if k in (1, 3):
                with hooks:
                    times.append(loop.steps(1))
            else:
                times.append(loop.steps(1))
        finally:
            nn.Module.__call__ = orig  # type: ignore[method-assign]
    load1 = os.getloadavg()
    stop_agent()
    base = statistics.median(t[0] for t, lab in zip(times, labels) if not lab)
    fit = fit_effects([t[0] for t in times], labels, len(kinds), robust=True)
    out: dict[str, object] = {"size": size, "steps": steps, "module_calls_per_step": loop.calls,
                              "saved_tensors_per_step": saved_per_step,
                              "load_average_1min": [round(load0[0], 2), round(load1[0], 2)],
                              "plain_step_cpu_ms": round(base * 1e3, 2)}
    for k, name in enumerate(kinds):
        f = fit[k]
        out[name] = {"ms_per_step": round(f["total"] * 1e3, 3),
                     "ratio": round(1 + f["total"] / base, 4),
                     "ratio_ci95": [round(1 + v / base, 4) for v in f["ci95"]]}
    return out


def run_hooks_cost(n: int = 20000) -> dict[str, object]:
    """What a loaded agent with tracing off adds per step on the training thread: the global
    optimizer hooks and the step subscribers, timed by calling optimizer.step() on an empty
    optimizer with and without the agent (alternating blocks)."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    tt = time.thread_time

    def block() -> float:
        t = tt()
        for _ in range(n):
            opt.step()
        return (tt() - t) / n

    without, with_ = [], []
    for _ in range(5):
        without.append(block())
        start_agent("off")
        time.sleep(0.3)
        with_.append(block())
        stop_agent()
    d = statistics.median(with_) - statistics.median(without)
    return {"optimizer_step_us_without": round(statistics.median(without) * 1e6, 2),
            "optimizer_step_us_with_agent_off": round(statistics.median(with_) * 1e6, 2),
            "added_us_per_step": round(d * 1e6, 2)}
