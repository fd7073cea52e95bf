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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = {  # name -> (d_model, layers, batch, ctx, steps per block, rounds)
    # ~5 ms CPU steps: ``mlp`` a small MLP (6 x Linear+ReLU, width d, batch b: 14 module calls,
    # what a new user tries first); ``tiny`` the GPT's 102 module calls with little math in them
    # (the worst case: ~20 module calls per ms)
    "mlp": (256, 6, 128, 0, 10, 40),
    "tiny": (32, 8, 2, 16, 10, 40),
    "small": (64, 8, 4, 64, 10, 40),
    "large": (128, 8, 8, 128, 10, 12),
}


class GcCounter:
    """Counts the collector's runs and their time per generation (gc.callbacks): a full
    collection of a big process is a pause the step pays, whoever allocated."""

    def __init__(self) -> None:
        import gc

        self.n = [0, 0, 0]
        self.ms = [0.0, 0.0, 0.0]
        self._t = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            g = info["generation"]
            self.n[g] += 1
            self.ms[g] += (time.perf_counter() - self._t) * 1e3

    def snapshot(self) -> tuple[int, float]:
        return self.n[2], sum(self.ms)


GC = GcCounter()


def bootstrap_median_ci(xs: list[float], n: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of the median (seeded: the report is reproducible)."""
    import random

    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n)]


class Attn(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.drop(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c)))


class MLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attn(d, h)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, ctx: int, heads: int = 4) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class MLPNet(nn.Module):
    def __init__(self, d: int, layers: int) -> None:
        super().__init__()
        self.net = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(d, d), nn.ReLU())])

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.net(x), target)


class Loop:
    def __init__(self, size: str) -> None:
        d, layers, b, ctx, self.block, self.rounds = SIZES[size]
        torch.manual_seed(0)
        if size == "mlp":
            self.model: nn.Module = MLPNet(d, layers)
            self.idx, self.tgt = torch.randn(b, d), torch.randn(b, d)
        else:
            self.model = GPT(512, d, layers, ctx)
            self.idx = torch.randint(0, 512, (b, ctx))
            self.tgt = torch.randint(0, 512, (b, ctx))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.calls = sum(1 for m in self.model.modules() if not isinstance(m, nn.ModuleList))

    def steps(self, n: int) -> tuple[float, ...]:
        """n steps -> mean (thread s, wall s, forward thread s, backward thread s, process CPU s
        incl. the agent's threads) per step, then full GC collections and GC ms in the block."""
        tt, pc = time.thread_time, time.perf_counter
        fwd = bwd = 0.0
        g0 = GC.snapshot()
        t0, w0, p0 = tt(), pc(), time.process_time()
        for _ in range(n):
            a = tt()
            loss = self.model(self.idx, self.tgt)
            b = tt()
            loss.backward()
            c = tt()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            fwd += b - a
            bwd += c - b
        g1 = GC.snapshot()
        return ((tt() - t0) / n, (pc() - w0) / n, fwd / n, bwd / n,
                (time.process_time() - p0) / n, g1[0] - g0[0], g1[1] - g0[1])


def start_agent(mode: str | None, retention_mb: int | None = None):  # type: ignore[no-untyped-def]
    import probe_agent
    from probe_agent.config import AgentConfig

    kw: dict[str, object] = {"port": 0, "run_dir": tempfile.mkdtemp(prefix="probe-b-"),
                             "watchdog": False, "trace_native": NATIVE}
    if mode is not None:
        kw["trace"] = mode
    if retention_mb is not None:
        kw["retention_mb"] = retention_mb
    return probe_agent.start(AgentConfig(**kw))


#: --native: the tracer's hot path (auto: the C++ one, built first if needed; off: Python).
NATIVE = "auto"
#: --paths: the hot paths --paired compares with untraced steps.
PATHS = ["python", "native"]


def load_native() -> str:
    """Build or load the C++ hot path before measuring, so that no run mixes the two paths."""
    from probe_agent.collectors.tracer.trace_native import LOADER

    if NATIVE == "off":
        return "python"
    LOADER.request(torch, NATIVE)
    LOADER.ready.wait(900)
    if LOADER.module is None:
        sys.exit(f"the C++ hot path is not available ({LOADER.status}); use --native off")
    return "native"


def stop_agent() -> None:
    import probe_agent

    probe_agent.stop()


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


def thread_cpu_s(prefix: str) -> float:
    """CPU seconds used so far by this process's threads whose name starts with ``prefix``
    (per-thread CPU clocks: nanoseconds, where /proc's ticks are 10 ms)."""
    import threading

    total = 0.0
    for t in threading.enumerate():
        if t.name.startswith(prefix) and t.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, ProcessLookupError):
                pass  # the thread just ended
    return total


def _ols(y: list[float], xs: list[list[int]]) -> list[float]:
    """Least squares y = k + sum(b_j * xs[j]): the coefficients b_j (normal equations on the
    centred data, Gaussian elimination)."""
    n, k = len(y), len(xs)
    my = sum(y) / n
    mx = [sum(x) / n for x in xs]
    cx = [[v - m for v in x] for x, m in zip(xs, mx)]
    a = [[sum(p * q for p, q in zip(cx[i], cx[j])) for j in range(k)]
         + [sum(p * (v - my) for p, v in zip(cx[i], y))] for i in range(k)]
    for c in range(k):
        piv = max(range(c, k), key=lambda r: abs(a[r][c]))
        a[c], a[piv] = a[piv], a[c]
        for r in range(k):
            if r != c and a[c][c]:
                f = a[r][c] / a[c][c]
                a[r] = [u - f * w for u, w in zip(a[r], a[c])]
    return [a[i][k] / a[i][i] if a[i][i] else 0.0 for i in range(k)]


def _detrend(y: list[float], k: int = 10) -> list[float]:
    """y minus its centred moving median over 2k+1 steps: the machine's slow swings (±20%
    over seconds on this VM) leave, step-to-step differences stay."""
    out = []
    for i in range(len(y)):
        w = sorted(y[max(0, i - k):i + k + 1])
        out.append(y[i] - w[len(w) // 2])
    return out


def _winsorized(d: list[float], k: float = 4.0) -> tuple[list[float], float]:
    """``d`` clipped to median ± k robust standard deviations (1.4826 MAD), and the upper bound.
    A step the machine stalled (a neighbour, a page-fault storm, the writer's resolve burst)
    lands on a random kind; clipped, it stops widening every interval, while a shift of the
    whole distribution (a cost) passes through almost whole."""
    s = sorted(d)
    med = s[len(s) // 2]
    mad = sorted(abs(v - med) for v in d)[len(d) // 2] * 1.4826
    lo, hi = med - k * mad, med + k * mad
    return [min(max(v, lo), hi) for v in d], hi


def _effects(y: list[float], x: list[int], kinds: int, reps: int = 1000,
             block: int = 25, robust: bool = False,
             skip: frozenset[int] = frozenset()) -> list[dict[str, object]]:
    """For each traced kind 1..kinds (0 = untraced): the cost of a step of that kind on itself
    (``direct``) and on the step after it (``carry``: work it leaves behind), by least squares
    over randomly assigned steps, with a 95% moving-block bootstrap interval of their sum.
    A mode change (``nn.Module.__call__`` reassigned) costs every kind alike, so it cancels out
    of the totals. ``robust``: on the winsorized steps (``_winsorized``); each kind's share of
    clipped-high steps is reported, so a cost that only shows as rare long steps stays visible."""
    import random

    d = _detrend(y)[1:]
    cur, prev = x[1:], x[:-1]
    if skip:  # steps left out of the fit (the FLOP meter's measured step: not a traced step's cost)
        keep = [i for i in range(len(d)) if i + 1 not in skip]
        d, cur, prev = [d[i] for i in keep], [cur[i] for i in keep], [prev[i] for i in keep]
    clipped_high = [0] * (kinds + 1)
    if robust:
        raw = d
        d, hi = _winsorized(d)
        for v, k in zip(raw, cur):
            clipped_high[k] += v > hi

    def fit(idx: list[int]) -> list[float]:
        cols = [[1 if s[i] == k else 0 for i in idx] for k in range(1, kinds + 1)
                for s in (cur, prev)]
        return _ols([d[i] for i in idx], cols)

    n = len(d)
    coef = fit(list(range(n)))
    rng = random.Random(0)
    sums: list[list[float]] = [[] for _ in range(kinds)]
    for _ in range(reps):
        idx: list[int] = []
        while len(idx) < n:
            s0 = rng.randrange(0, n - block)
            idx.extend(range(s0, s0 + block))
        c = fit(idx[:n])
        for k in range(kinds):
            sums[k].append(c[2 * k] + c[2 * k + 1])
    out = []
    for k in range(kinds):
        sums[k].sort()
        ci = (sums[k][int(0.025 * reps)], sums[k][int(0.975 * reps)]) if reps else None
        out.append({"direct": coef[2 * k], "carry": coef[2 * k + 1],
                    "total": coef[2 * k] + coef[2 * k + 1], "ci95": ci,
                    "clipped_high": [clipped_high[0], clipped_high[k + 1]]})
    return out


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
    paths = [p for p in PATHS if p == "python" or NATIVE != "off"]
    rng = random.Random(1)

    def coin() -> None:  # set now, applies at this step's optimizer.step(): the next step
        k = rng.randrange(len(paths) + 1)
        tracer.native_mode = "off" if k and paths[k - 1] == "python" else NATIVE
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
    cpu = _effects([t[0] for t in times], labels, kinds, skip=skip)
    robust = _effects([t[0] for t in times], labels, kinds, robust=True, skip=skip)
    wall = _effects([t[1] for t in times], labels, kinds, robust=True, skip=skip)
    fwd = _effects([t[2] for t in times], labels, kinds, reps=0, skip=skip)
    bwd = _effects([t[3] for t in times], labels, kinds, reps=0, skip=skip)
    writer = agent_cpu / traced
    hooks = run_hooks_cost()
    off_s = hooks["added_us_per_step"] * 1e-6 + idle_cpu_per_step
    # every:10 changes mode twice per 10 steps (measured as the cost of a switch)
    toggle = max(_toggle([t[0] for t in times], labels, skip), 0.0)
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


def _toggle(y: list[float], x: list[int], skip: frozenset[int] = frozenset()) -> float:
    """The cost of a mode change (installing or removing the wrapper reassigns
    ``nn.Module.__call__``), from the cell means of traced/untraced pairs:
    (E[1,0] + E[0,1] - E[1,1] - E[0,0]) / 2, any path counting as traced."""
    d = _detrend(y)[1:]
    cells: dict[tuple[bool, bool], list[float]] = {}
    for i, (v, a, b) in enumerate(zip(d, x[1:], x[:-1])):
        if i + 1 not in skip:
            cells.setdefault((bool(a), bool(b)), []).append(v)
    if len(cells) < 4:
        return 0.0
    m = {k: statistics.fmean(v) for k, v in cells.items()}
    return (m[True, False] + m[False, True] - m[True, True] - m[False, False]) / 2


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
    fit = _effects([t[0] for t in times], labels, len(kinds), robust=True)
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
    modes = ["off", "python"] + (["native"] if NATIVE != "off" else [])
    got: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for _ in range(reps):
        for mode in modes:
            tracer.native_mode = "off" if mode == "python" else NATIVE
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


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


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
    global NATIVE, PATHS
    NATIVE = args.native
    PATHS = [p for p in args.paths.split(",") if p in ("python", "native")]
    print(f"hot path: {load_native()}", file=sys.stderr)
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
