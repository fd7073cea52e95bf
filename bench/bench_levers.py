"""The cost of the lever's counters at a ~5 ms step with the default tracing (every:10), side by
side in one process that loads the agent in every arm (docs/decisions/measurement-method.md:
a no-agent baseline hides cost):

- host syncs: the counter's patched methods installed (``patch``, what the agent does) against
  them removed (``off``), and against the alternative it rejects, a counting
  ``TorchFunctionMode`` on every step (``mode``); on a loop with a few syncs per step (logging
  the loss, a format, a nonzero: the healthy case) and on one with 300 ``.item()`` per step
  (the per-call price, reported in microseconds per sync);
- MoE counts: a plain-code top-2 MoE (4 layers x 8 experts) with the counter on (hooks on the
  sampled steps, every 10th) against off;
- ``.to()``: the stand-in a CUDA job gets in front of ``Tensor.to`` (to count ``.to("cpu")``),
  per call on the path every batch move takes (a CPU tensor: returns to the original after one
  ``is_cpu`` read), against the original, in nanoseconds (best of many repeats, alternated);
  and likewise one counted ``.item()``: the price of each sync, which times a loop's syncs per
  step bounds the counter's cost where the step-time ratios are too noisy to.

Arms alternate in blocks of ``--block`` steps (ABAB..., the order within each round shuffled);
each round gives one ratio of median step times (arm / off), and the report is the median
ratio with a 95% bootstrap interval over rounds. Timed assertions never go in tests: this is
where the numbers come from.

    .venv/bin/python bench/bench_levers.py                  # all, ~2 min on 2 busy cores
    .venv/bin/python bench/bench_levers.py --only syncs --rounds 40
    .venv/bin/python bench/bench_levers.py --device cuda    # the GPU check (bench/gpu_check.py)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.tracing_stats import bootstrap_median_ci  # noqa: E402


def _mlp(torch: Any, device: str, width: int) -> Any:
    nn = torch.nn
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 1)).to(device)


class _CountingMode:
    """The rejected alternative: a TorchFunctionMode that sees every torch call of the step and
    counts those that sync (by name)."""

    SYNCS = frozenset({"item", "tolist", "cpu", "numpy", "nonzero", "__format__", "__repr__"})

    @classmethod
    def make(cls, torch: Any) -> Any:
        from torch.overrides import TorchFunctionMode

        class Mode(TorchFunctionMode):
            def __init__(self) -> None:
                super().__init__()
                self.n = 0

            def __torch_function__(self, func: Any, types: Any, args: Any = (),
                                   kwargs: Any = None) -> Any:
                if getattr(func, "__name__", "") in cls.SYNCS:
                    self.n += 1
                    sys._getframe(1)
                return func(*args, **(kwargs or {}))

        return Mode()


def _sync_loop(torch: Any, device: str, width: int, batch: int, items: int) -> Any:
    model = _mlp(torch, device, width)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=device)

    def step() -> None:
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        v = loss.detach()
        for _ in range(items):
            v.item()
        f"{loss.item():.4f}"
        torch.nonzero(x[0] > 0)

    return step


def _moe_loop(torch: Any, device: str, width: int, batch: int) -> Any:
    nn = torch.nn

    class Moe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.top_k = 2
            self.gate = nn.Linear(width, 8)
            self.experts = nn.ModuleList(nn.Linear(width, width) for _ in range(8))

        def forward(self, h: Any) -> Any:
            w, idx = self.gate(h).softmax(-1).topk(2, dim=-1)
            out = torch.zeros_like(h)
            for e, ex in enumerate(self.experts):
                out = out + (w * (idx == e)).sum(-1, keepdim=True) * ex(h)
            return out

    model = nn.Sequential(*(Moe() for _ in range(4))).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=device)

    def step() -> None:
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _timed(torch: Any, step: Any, n: int, device: str) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def _compare(torch: Any, step: Any, arms: dict[str, Any], rounds: int, block: int,
             device: str) -> dict[str, Any]:
    """arms: name -> (enter, leave) around its blocks; "off" is the baseline."""
    rng = random.Random(0)
    per: dict[str, list[float]] = {a: [] for a in arms}
    ratios: dict[str, list[float]] = {a: [] for a in arms if a != "off"}
    for _ in range(rounds):
        order = list(arms)
        rng.shuffle(order)
        med = {}
        for a in order:
            enter, leave = arms[a]
            enter()
            _timed(torch, step, 3, device)  # settle after the switch
            xs = _timed(torch, step, block, device)
            leave()
            med[a] = statistics.median(xs)
            per[a].extend(xs)
        for a in ratios:
            ratios[a].append(med[a] / med["off"])
    out: dict[str, Any] = {"step_ms_off": round(statistics.median(per["off"]) * 1e3, 3)}
    for a, rs in ratios.items():
        lo, hi = bootstrap_median_ci(rs)
        out[a] = {"ratio": round(statistics.median(rs), 4), "ci95": [round(lo, 4), round(hi, 4)],
                  "step_ms": round(statistics.median(per[a]) * 1e3, 3)}
    return out


def run_syncs(torch: Any, agent: Any, device: str, rounds: int, block: int, items: int,
              width: int, batch: int) -> dict[str, Any]:
    counter = agent.collectors.get("host_syncs")
    step = _sync_loop(torch, device, width, batch, items)
    mode = _CountingMode.make(torch)
    for _ in range(15):
        step()  # the agent's first steps: counter installed, FLOP meter done

    def nothing() -> None:
        return None

    arms = {
        "off": (counter.uninstall, lambda: counter.install(torch)),
        "patch": (nothing, nothing),
        "mode": (lambda: (counter.uninstall(), mode.__enter__()),
                 lambda: (mode.__exit__(None, None, None), counter.install(torch))),
    }
    res = _compare(torch, step, arms, rounds, block, device)
    res["syncs_per_step"] = items + 2
    return res


def run_moe(torch: Any, agent: Any, device: str, rounds: int, block: int, width: int,
            batch: int) -> dict[str, Any]:
    moe = agent.collectors.get("moe")
    step = _moe_loop(torch, device, width, batch)
    moe._scanned_at = None  # look for routers again: the model is built after the other arms
    for _ in range(200):  # until a sampled step found them (once, at load 23, not in 25 steps)
        step()
        if moe.routers:
            break
    for _ in range(10):
        step()
    if not moe.routers:
        raise SystemExit("the MoE counter found no router: the moe arm would measure nothing")

    def on() -> None:
        moe.guard.enabled = True

    def off() -> None:
        moe.guard.enabled = False

    res = _compare(torch, step, {"off": (off, on), "on": (on, on)}, rounds, block, device)
    res["routers"] = moe.state()["routers"]
    return res


def _per_call(original: Any, patched: Any, *args: Any, repeats: int = 30) -> dict[str, Any]:
    """ns per call of ``patched(*args)`` against ``original(*args)``: the best of many short
    timings, the two alternated (the best is the least disturbed by a busy machine)."""
    import timeit

    best: dict[str, list[float]] = {"original": [], "patched": []}
    for _ in range(repeats):
        for name, f in (("original", original), ("patched", patched)):
            best[name].append(min(timeit.repeat(lambda f=f: f(*args), number=2000,
                                                repeat=3)) / 2000 * 1e9)
    a, b = min(best["original"]), min(best["patched"])
    return {"original_ns": round(a), "patched_ns": round(b), "added_ns": round(b - a),
            "patched": patched is not original}


def run_item(torch: Any, agent: Any) -> dict[str, Any]:
    """One counted ``.item()`` (the stand-in, the frame walk to this file, the site's count)
    against the original: the price of each sync the loop makes."""
    from probe_agent import patches

    step = _sync_loop(torch, "cpu", 8, 2, 0)
    for _ in range(3):
        step()  # the counter goes in at the agent's first step
    patched = torch.Tensor.item
    original = getattr(patched, "__wrapped__", None) if patches.ours(patched) else None
    if original is None:
        raise SystemExit("the host-sync counter's .item() stand-in is not in place")
    return _per_call(original, patched, torch.ones(()))


def run_to(torch: Any, agent: Any) -> dict[str, Any]:
    """A batch move through the ``Tensor.to`` stand-in (a CPU tensor: not counted) against the
    original: what every ``.to()`` pays on a CUDA job."""
    counter = agent.collectors.get("host_syncs")
    original = torch.Tensor.to
    counter.install_to(torch)
    return _per_call(original, torch.Tensor.to, torch.ones(64), "cpu")


def _loadavg() -> str | None:
    """The machine's load when the run started (a shared machine's number needs it beside)."""
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("syncs", "syncs300", "moe", "item", "to"), action="append")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1, as torchrun sets: on a shared machine "
                         "intra-op threads that wait for a descheduled peer make a 5 ms step "
                         "take 100s of ms, and the noise hides the cost)")
    args = ap.parse_args()
    import torch

    if args.device == "cpu":
        torch.set_num_threads(args.threads)

    import probe_agent
    from probe_agent.config import AgentConfig

    torch.manual_seed(0)
    run = tempfile.mkdtemp(prefix="probe-bl-")
    agent: Any = probe_agent.start(AgentConfig(port=0, run_dir=run, watchdog=False,
                                               trace="every:10"))
    only = set(args.only or ("syncs", "syncs300", "moe", "item", "to"))
    out: dict[str, Any] = {"device": args.device, "torch": torch.__version__,
                           "rounds": args.rounds, "block": args.block,
                           "threads": torch.get_num_threads(), "loadavg": _loadavg()}
    try:
        if "syncs" in only:
            out["syncs_few"] = run_syncs(torch, agent, args.device, args.rounds, args.block, 1,
                                         args.width, args.batch)
            print(json.dumps({"syncs_few": out["syncs_few"]}), flush=True)
        if "syncs300" in only:
            r = run_syncs(torch, agent, args.device, args.rounds, args.block, 300, args.width,
                          args.batch)
            r["us_per_sync"] = round((r["patch"]["step_ms"] - r["step_ms_off"]) * 1e3 / 302, 2)
            out["syncs_300"] = r
            print(json.dumps({"syncs_300": r}), flush=True)
        if "moe" in only:
            out["moe"] = run_moe(torch, agent, args.device, args.rounds, args.block,
                                 args.width // 2, args.batch)
            print(json.dumps({"moe": out["moe"]}), flush=True)
        if "item" in only:
            out["item_call"] = run_item(torch, agent)
            print(json.dumps({"item_call": out["item_call"]}), flush=True)
        if "to" in only:  # last: it leaves Tensor.to patched until the agent stops
            out["to_call"] = run_to(torch, agent)
            print(json.dumps({"to_call": out["to_call"]}), flush=True)
    finally:
        probe_agent.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
