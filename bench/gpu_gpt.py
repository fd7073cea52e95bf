"""The GPU check's training job: a small real GPT under ``PROBE=1`` with bf16 autocast, and the
checks that compare what probe reports with torch's own numbers (bench/gpu_check.py runs it).

Modes (each writes ``<out>/result.json``: a list of sub-checks, each ``ok`` True, False, or None
for a number that is reported, not judged):

- ``one``: one process. Module times from CUDA events (python.torch_trace) against
  torch.profiler's kernel times for the same step; memory by kind (`probe memory --json`)
  against ``torch.cuda.memory_allocated`` measured around forward and after the step, and the
  allocator snapshot; tokens/s (`probe throughput --json`) against the loop's own timing; MFU
  against the data-sheet bf16 peak of the detected GPU (probe_agent/collectors/peak.py) and
  FlopCounterMode; the throughput lever's CUDA wording on steps with a 30 ms host gap.
- ``two``: under torchrun, 2 processes sharing the GPU over gloo (DDP): every rank reports
  CUDA rows, `probe hang` and `probe throughput` see both.
(Tracing's cost on the GPU, with the same model: bench/gpu_tracing_cost.py.)

``--device cpu`` runs the same code on CPU with a tiny model (what CI's smoke test does); the
comparisons that need CUDA then say so and judge nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
HOST_GAP_MS = 30.0
#: (ok when inside) agent CUDA-event span / profiler kernel time of one block's forward: the
#: span holds every kernel plus the launch gaps between them, so it is never much below 1.
SPAN_OVER_KERNELS = (0.9, 1.6)
KIND_TOLERANCE = {"parameters": 0.02, "gradients": 0.02, "optimizer": 0.02, "activations": 0.3}


class Block(nn.Module):
    def __init__(self, d: int, heads: int, index: int) -> None:
        super().__init__()
        self.index, self.heads = index, heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the profiler's name for this block's forward (a no-op unless a profiler runs)
        with torch.profiler.record_function(f"gpu_check.h.{self.index}"):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                       for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, ctx: int, heads: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Block(d, heads, i) for i in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class Job:
    """The model, its optimizer and one batch, stepped with bf16 autocast on ``device``."""

    def __init__(self, device: str, batch: int, ddp: bool = False) -> None:
        cuda = device.startswith("cuda")
        d, layers, self.ctx, heads, vocab = (768, 6, 256, 12, 8192) if cuda else (64, 2, 32, 4, 256)
        torch.manual_seed(0)
        self.device, self.batch, self.vocab = device, batch, vocab
        self.raw = GPT(vocab, d, layers, self.ctx, heads).to(device)
        self.model: nn.Module = self.raw
        if ddp:
            self.model = nn.parallel.DistributedDataParallel(self.raw)
        self.opt = torch.optim.AdamW(self.raw.parameters(), lr=1e-4)
        self.x = torch.randint(0, vocab, (batch, self.ctx), device=device)
        self.y = torch.randint(0, vocab, (batch, self.ctx), device=device)
        self.autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16)

    @property
    def tokens(self) -> int:
        return self.batch * self.ctx

    def forward(self) -> torch.Tensor:
        with self.autocast:
            logits = self.model(self.x)
            return F.cross_entropy(logits.float().view(-1, self.vocab), self.y.view(-1))

    def step(self, host_gap_s: float = 0.0) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.forward().backward()
        self.opt.step()
        if host_gap_s:
            time.sleep(host_gap_s)  # host work outside every module: the GPU idles

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def timed(self, n: int, host_gap_s: float = 0.0) -> float:
        """Seconds per step over ``n`` steps, the GPU drained at both ends."""
        self.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            self.step(host_gap_s)
        self.sync()
        return (time.perf_counter() - t0) / n


def probe(url: str, *args: str, timeout: float = 120) -> tuple[int, Any, str]:
    """The real CLI against this job: (exit code, parsed --json output or None, stderr)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PROBE", None)  # the CLI process must not start an agent of its own
    r = subprocess.run([sys.executable, "-m", "probe_cli", "-t", url, "--timeout", "30",
                        "--json", *args], capture_output=True, text=True, env=env,
                       timeout=timeout)
    try:
        body = json.loads(r.stdout) if r.stdout.strip() else None
    except json.JSONDecodeError:
        body = None
    return r.returncode, body, r.stderr[-2000:]


def within(got: float | None, want: float | None, rel: float) -> bool:
    return got is not None and want is not None and abs(got - want) <= rel * max(abs(want), 1e-9)


def agent() -> Any:
    import probe_agent.process

    a = probe_agent.process.current()
    if a is None:
        raise SystemExit("no agent in this process: run with PROBE=1 (bench/gpu_check.py does)")
    return a


def query(url: str, sql: str) -> list[list[Any]]:
    code, body, err = probe(url, "query", sql)
    if code != 0 or not body:
        raise RuntimeError(f"probe query failed ({code}): {err}")
    return [row for b in body for row in b.get("rows", [])]


def check_module_times(job: Job, url: str, cuda: bool) -> list[dict[str, Any]]:
    """One step under torch.profiler: each block's forward, CUDA-event span against kernels."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        job.step()
        job.sync()
    step = agent().stepclock.current_step
    kernels_ms: dict[str, float] = {}
    for e in prof.events():
        if e.name.startswith("gpu_check.h.") and e.device_type.name == "CPU":
            kernels_ms[e.name.removeprefix("gpu_check.")] = e.device_time_total / 1e3
    names = ", ".join(f"'{m}'" for m in kernels_ms) or "''"
    spans: dict[str, float] = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(spans) < len(kernels_ms):
        spans = {m: d * 1e3 for m, d in query(
            url, f"SELECT module, sum(duration) FROM python.torch_trace WHERE step = {step} "
                 f"AND stage = 'forward' AND module IN ({names}) GROUP BY module")}
        time.sleep(0.5)
    out = []
    for m, k in sorted(kernels_ms.items()):
        s = spans.get(m)
        ratio = s / k if s is not None and k > 0 else None
        # on CUDA a block with no kernel time or no row is a failure, not a pass
        ok = (ratio is not None and SPAN_OVER_KERNELS[0] <= ratio <= SPAN_OVER_KERNELS[1]) \
            if cuda else None
        out.append({"name": f"module_time {m} forward", "ok": ok,
                    "probe_ms": s, "profiler_kernels_ms": k, "ratio": ratio,
                    "tolerance": f"{SPAN_OVER_KERNELS[0]} <= span/kernels <= "
                                 f"{SPAN_OVER_KERNELS[1]}", "step": step,
                    **({} if cuda else {"detail": "CPU: no kernels to compare against"})})
    if not out:
        out.append({"name": "module_time", "ok": False, "detail": "the profiler saw no block"})
    return out


def truth_memory(job: Job) -> dict[str, float]:
    """MiB by kind as torch counts them: parameters, gradients, optimizer state; activations
    as the allocator's growth over the forward pass (what backward will free)."""
    mib = 1 / 2**20
    params = sum(p.numel() * p.element_size() for p in job.raw.parameters()) * mib
    optim = sum(t.numel() * t.element_size() for s in job.opt.state.values()
                for t in s.values() if torch.is_tensor(t)) * mib
    job.opt.zero_grad(set_to_none=True)
    job.sync()
    before = torch.cuda.memory_allocated()
    loss = job.forward()
    job.sync()
    activations = (torch.cuda.memory_allocated() - before) * mib
    loss.backward()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in job.raw.parameters()
                if p.grad is not None) * mib
    job.opt.step()
    job.sync()
    snap = torch.cuda.memory._snapshot()
    active = sum(b["size"] for s in snap["segments"] for b in s["blocks"]
                 if b["state"] == "active_allocated") * mib
    return {"parameters": params, "gradients": grads, "optimizer": optim,
            "activations": activations, "allocated": torch.cuda.memory_allocated() * mib,
            "snapshot_active": active}


def check_memory(job: Job, url: str, cuda: bool) -> list[dict[str, Any]]:
    if not cuda:
        return [{"name": "memory_by_kind", "ok": None, "detail": "CPU: no CUDA allocator"}]
    truth = truth_memory(job)
    for _ in range(3):
        job.step()
    code, body, err = probe(url, "memory", "--last", "3")
    bd = (body or [{}])[0].get("breakdown") or {}
    out = [{"name": f"memory {k}", "ok": within(bd.get(f"{k}_mib"), truth[k], tol),
            "probe_mib": bd.get(f"{k}_mib"), "torch_mib": round(truth[k], 2),
            "tolerance": f"±{tol:.0%}"} for k, tol in KIND_TOLERANCE.items()]
    out.append({"name": "memory allocated after the step", "ok":
                within(bd.get("allocated_mib"), truth["allocated"], 0.05),
                "probe_mib": bd.get("allocated_mib"), "torch_mib": round(truth["allocated"], 2),
                "snapshot_active_mib": round(truth["snapshot_active"], 2), "tolerance": "±5%",
                **({} if code == 0 else {"detail": err})})
    out.append({"name": "memory snapshot agrees with memory_allocated", "ok":
                within(truth["snapshot_active"], truth["allocated"], 0.01)})
    return out


def check_throughput(job: Job, url: str, cuda: bool, per_step_s: float) -> list[dict[str, Any]]:
    from torch.utils.flop_counter import FlopCounterMode

    from probe_agent.collectors.peak import table_peak

    code, body, err = probe(url, "throughput", "--last", "20")
    t = (body or [{}])[0].get("throughput") or {}
    own_tps = job.tokens / per_step_s
    counter = FlopCounterMode(display=False)
    with counter:
        job.step()
    own_flops_s = counter.get_total_flops() / per_step_s
    out = [{"name": "tokens/s", "ok": within(t.get("tokens_per_s"), own_tps, 0.10),
            "probe": t.get("tokens_per_s"), "script": round(own_tps, 1), "tolerance": "±10%",
            **({} if code == 0 else {"detail": err})},
           {"name": "FLOP/s", "ok": within(t.get("flops_per_s"), own_flops_s, 0.15),
            "probe": t.get("flops_per_s"), "script_flopcounter": own_flops_s,
            "tolerance": "±15%"}]
    if not cuda:
        return out + [{"name": "MFU", "ok": None, "detail": "CPU: the peak is measured"}]
    sheet = table_peak(torch.cuda.get_device_name(), "bfloat16")
    peak = t.get("peak_flops")
    out.append({"name": "MFU peak is the data sheet's bf16 peak of this GPU",
                "ok": sheet is not None and within(peak, sheet[0], 0.001)
                and t.get("compute_dtype") == "bfloat16",
                "gpu": torch.cuda.get_device_name(), "probe_peak": peak,
                "probe_source": t.get("peak_source"), "compute_dtype": t.get("compute_dtype"),
                "data_sheet": sheet})
    mfu = t.get("mfu")
    out.append({"name": "MFU", "ok": sheet is not None and within(mfu, own_flops_s / sheet[0],
                                                                  0.15),
                "probe": mfu, "script": own_flops_s / sheet[0] if sheet else None,
                "tolerance": "±15%"})
    return out


def check_lever(job: Job, url: str, cuda: bool) -> list[dict[str, Any]]:
    job.timed(12, HOST_GAP_MS / 1e3)
    code, body, err = probe(url, "throughput", "--last", "8")
    t = (body or [{}])[0].get("throughput") or {}
    lever = t.get("lever") or {}
    if not cuda:
        return [{"name": "lever wording", "ok": None, "lever": lever, "on_cuda": t.get("on_cuda")}]
    return [{"name": "lever: host gap in the CUDA wording",
             "ok": t.get("on_cuda") is True and lever.get("lever") == "host"
             and "GPU outside the model's kernels" in (lever.get("evidence") or ""),
             "on_cuda": t.get("on_cuda"), "lever": lever, "host_share": t.get("host_share")}]


def run_one(args: argparse.Namespace) -> list[dict[str, Any]]:
    cuda = args.device.startswith("cuda")
    job = Job(args.device, args.batch)
    a = agent()
    code, _, err = probe(a.url, "trace", "on")
    if code != 0:
        return [{"name": "probe trace on", "ok": False, "detail": err}]
    job.timed(args.warmup)
    per_step = job.timed(args.steps)
    out = [{"name": "step", "ok": None, "ms": round(per_step * 1e3, 2), "tokens": job.tokens,
            "device": torch.cuda.get_device_name() if cuda else "cpu"}]
    for check in (lambda: check_throughput(job, a.url, cuda, per_step),
                  lambda: check_module_times(job, a.url, cuda),
                  lambda: check_memory(job, a.url, cuda),
                  lambda: check_lever(job, a.url, cuda)):
        try:
            out += check()
        except Exception as e:  # one failing comparison must not hide the others
            out.append({"name": getattr(check, "__name__", "check"), "ok": False,
                        "detail": f"{type(e).__name__}: {e}"})
    return out


def run_two(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    job = Job(args.device, args.batch, ddp=True)
    job.timed(args.warmup)
    results: list[dict[str, Any]] = []
    done = threading.Event()

    def ask() -> None:  # rank 0 asks while both ranks keep stepping (a pause would read as hang)
        try:
            url = agent().url
            code, body, err = probe(url, "throughput", "--last", "10")
            ranks = sorted(b.get("rank") for b in body or [])
            cuda = [bool((b.get("throughput") or {}).get("on_cuda")) for b in body or []]
            results.append({"name": "both ranks report CUDA step times", "ok":
                            ranks == [0, 1] and all(cuda), "ranks": ranks, "on_cuda": cuda,
                            **({} if code == 0 else {"detail": err})})
            rows = query(url, "SELECT device, count(*) FROM python.memory GROUP BY device")
            results.append({"name": "memory rows on cuda:0 from both ranks", "ok":
                            any(r[0] == "cuda:0" and r[1] > 0 for r in rows), "rows": rows})
            code, _, err = probe(url, "hang")
            results.append({"name": "probe hang: no hang", "ok": code == 0, "exit": code,
                            "detail": err[-300:]})
        except Exception as e:
            results.append({"name": "two-process checks", "ok": False,
                            "detail": f"{type(e).__name__}: {e}"})
        finally:
            done.set()

    if rank == 0:
        threading.Thread(target=ask, daemon=True).start()
    flag = torch.zeros(1)
    while True:
        job.step()
        flag[0] = 1.0 if rank == 0 and done.is_set() else 0.0
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
    dist.destroy_process_group()
    return results if rank == 0 else []


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("one", "two"))
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    run = {"one": run_one, "two": run_two}[args.mode]
    results = run(args)
    if results or os.environ.get("RANK", "0") == "0":
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "result.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
