"""The cost of `probe profile` and `probe flame` (issue 16), measured side by side.

``--part profile``: cost per profiled step. The GPT of bench_tracing.py at ``small`` (~30 ms CPU
step) and ``large`` (~200 ms), one process with the agent (tracing off, so the baseline is the
plain step). Rounds of ``--block`` plain steps, then a profile window of ``--steps`` steps queued
through the real step-boundary action; each step's wall time is recorded by the loop. Reported:
median plain step, median profiled step, their ratio per round (median over rounds), the extra
time of the start boundary (step S) and the stop boundary (step S+N, ``stop_ms``), the export's
time (off the training thread) and the trace size per profiled step.

``--part sampler``: the flame sampler's cost at ``--rate`` Hz, in-process sampler vs ``py-spy
record --nonblocking`` (out of process), both run by the agent's flame session as `probe flame
--sampler in-process|py-spy` runs them, on the small model. Windows of ``--window`` seconds,
interleaved (plain, in-process, plain, py-spy, ...), so drift hits both alike; the step-time
ratio of each sampled window over the two plain windows around it, median over rounds. Also the
training thread's CPU time per step (``thread_time``), which the other processes on these shared
cores inflate least.

``--part merge``: time from the command to the merged trace on disk for a real 2-rank torchrun
job (``python -m probe_cli profile --steps 3``, the whole command, start-up included), and the
merge alone of 16 simulated ranks (copies of real rank traces of the GPT, each renumbered).

Usage: python bench/bench_profile.py [--part profile,sampler,merge] [--sizes small,large]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from tracing_workload import GPT, SIZES  # noqa: E402


class Model:
    """One size of the GPT with its optimizer and a fixed batch."""

    def __init__(self, size: str) -> None:
        d, layers, b, ctx, _, _ = SIZES[size]
        torch.manual_seed(0)
        self.model = GPT(512, d, layers, ctx)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.idx = torch.randint(0, 512, (b, ctx))
        self.tgt = torch.randint(0, 512, (b, ctx))

    def step(self) -> tuple[float, float]:
        """One training step: (wall s, training-thread CPU s)."""
        w0, c0 = time.perf_counter(), time.thread_time()
        self.model(self.idx, self.tgt).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - w0, time.thread_time() - c0


def start_agent():  # type: ignore[no-untyped-def]
    import probe_agent
    from probe_agent.config import AgentConfig

    run_dir = tempfile.mkdtemp(prefix="probe-bp-")
    TEMP_DIRS.append(run_dir)  # its profiles/ hold the rank traces the merge part reuses
    return probe_agent.start(AgentConfig(port=0, run_dir=run_dir, watchdog=False, trace="off"))


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# -- profile ------------------------------------------------------------------------------------
def run_profile(size: str, rounds: int, block: int, steps: int) -> dict[str, object]:

    agent = start_agent()
    m = Model(size)
    for _ in range(5):
        m.step()
    ratios, plain_all, prof_all, start_extra, stop_ms, export_ms, mb_per_step = (
        [], [], [], [], [], [], [])
    export_ratio: list[float] = []
    try:
        for r in range(rounds):
            plain = [m.step()[0] for _ in range(block)]
            a = agent.actions.submit(kind="profile", step=None, code="bench", args={
                "steps": steps}, client="bench", requested_by=None, action_id=f"b{r}",
                group=None)
            times = {}
            while True:  # until the window closes (the action runs at the next boundary)
                n = agent.stepclock.current_step + 1  # the step about to run
                times[n] = m.step()[0]
                w = agent.profiling.windows.get(a.id)
                if w is not None and w.state != "recording":
                    break
                if a.state in ("error", "skipped", "cancelled"):
                    raise SystemExit(f"the profile action did not run: {a.error}")
            during_export = []
            while w.state == "exporting":  # the export thread shares the GIL: measure it
                during_export.append(m.step()[0])
            inside = [times[s] for s in range(w.start_step + 1, w.last_step + 1) if s in times]
            ratios.append(med(inside) / med(plain))
            plain_all += plain
            prof_all += inside
            start_extra.append((times.get(w.start_step, med(plain)) - med(plain)) * 1e3)
            stop_ms.append(w.stop_ms)
            export_ms.append(w.export_ms)
            export_ratio.append(med(during_export) / med(plain) if during_export else 1.0)
            mb_per_step.append(w.trace_bytes / 2**20 / steps)
        if w.trace_path:
            PROFILE_TRACES.append(w.trace_path)
    finally:
        import probe_agent

        probe_agent.stop()
    return {"size": size, "rounds": rounds, "profiled_steps_per_round": steps,
            "plain_step_ms": round(med(plain_all) * 1e3, 2),
            "profiled_step_ms": round(med(prof_all) * 1e3, 2),
            "ratio_median_of_rounds": round(med(ratios), 3),
            "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
            "start_boundary_extra_ms": round(med(start_extra), 2),
            "stop_ms": round(med(stop_ms), 2), "export_ms_off_thread": round(med(export_ms), 1),
            "step_ratio_during_export": round(med(export_ratio), 3),
            "trace_mib_per_step": round(med(mb_per_step), 2)}


# -- sampler ------------------------------------------------------------------------------------
def run_sampler(size: str, rounds: int, window: float, rate: float) -> dict[str, object]:

    agent = start_agent()
    m = Model(size)
    for _ in range(5):
        m.step()
    state = {"arm": "plain"}
    log: list[tuple[str, float, float]] = []  # (arm, wall, cpu) per step
    stop = threading.Event()
    sampler_cpu: dict[str, list[float]] = {"inprocess": [], "pyspy": []}

    def driver() -> None:
        for r in range(rounds):
            for arm in ("plain", "inprocess", "plain", "pyspy"):
                if stop.is_set():
                    return
                state["arm"] = arm
                if arm == "plain":
                    time.sleep(window)
                else:  # the agent's own flame session, as `probe flame --sampler ...` runs it
                    f = agent.profiling.start_flame(
                        f"{arm}{r}", window, rate, "bench", None,
                        "in-process" if arm == "inprocess" else "py-spy")
                    f.wait(window + 30)
                    if f.state != "done":
                        raise SystemExit(f"the {arm} sampler failed: {f.error}")
                    sampler_cpu[arm].append(f.cost["sampler_cpu_share"])
        state["arm"] = "plain"
        time.sleep(window)  # the plain window after the last sampled one
        stop.set()

    th = threading.Thread(target=driver, daemon=True)
    th.start()
    try:
        while not stop.is_set():
            arm = state["arm"]
            w, c = m.step()
            if state["arm"] == arm:  # a step across a switch belongs to neither window
                log.append((arm, w, c))
    finally:
        import probe_agent

        probe_agent.stop()
    # windows in order: runs of one arm; each sampled window against the plain ones around it
    runs: list[tuple[str, list[tuple[float, float]]]] = []
    for arm, w, c in log:
        if not runs or runs[-1][0] != arm:
            runs.append((arm, []))
        runs[-1][1].append((w, c))
    res: dict[str, dict[str, list[float]]] = {"inprocess": {"wall": [], "cpu": []},
                                              "pyspy": {"wall": [], "cpu": []}}
    for i, (arm, steps) in enumerate(runs):
        if arm == "plain" or i == 0 or i + 1 >= len(runs):
            continue
        around = runs[i - 1][1] + runs[i + 1][1]
        for k, j in (("wall", 0), ("cpu", 1)):
            res[arm][k].append(med([s[j] for s in steps]) / med([s[j] for s in around]))
    return {"size": size, "rate_hz": rate, "window_s": window, "rounds": rounds,
            "plain_step_ms": round(med([w for a, w, _ in log if a == "plain"]) * 1e3, 2),
            **{f"{arm}_{k}_ratio": round(med(v), 3) for arm, d in res.items()
               for k, v in d.items()},
            **{f"{arm}_wall_ratios": [round(x, 3) for x in d["wall"]] for arm, d in res.items()},
            **{f"{arm}_sampler_cpu_share": round(med(v), 4) for arm, v in sampler_cpu.items()}}


# -- merge --------------------------------------------------------------------------------------
def run_merge(repeats: int) -> dict[str, object]:
    from probe_cli.export.trace_merge import RankTrace, merge_traces
    from probe_cli.transport.client import ProbeClient
    from probe_cli.transport.targets import Endpoint

    tmp = Path(tempfile.mkdtemp(prefix="probe-bm-"))
    (tmp / "ready").mkdir()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PROBE")},
           "PROBE": "1", "PROBE_PORT": "0", "PROBE_WATCHDOG": "0", "PROBE_TRACE": "off",
           "PROBE_RUN_DIR": str(tmp / "run"), "PYTHONPATH": str(ROOT)}
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
         "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
         str(ROOT / "tests/programs/profile_slow_fn.py"), "--ready-dir", str(tmp / "ready"),
         "--stop-file", str(tmp / "stop")], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp / "ready" / f"rank{r}.json").exists() for r in (0, 1)):
            if time.monotonic() > deadline or job.poll() is not None:
                raise SystemExit("the 2-rank job did not start")
            time.sleep(0.1)
        url = json.loads((tmp / "ready" / "rank0.json").read_text())["url"]
        walls = []
        for i in range(repeats):
            out = tmp / f"merged{i}.json"
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "probe_cli", "-t", url, "profile",
                            "--steps", "3", "-o", str(out)], check=True, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            walls.append(time.perf_counter() - t0)
            assert out.exists()
        two = {"command_to_merged_trace_s": round(med(walls), 3),
               "runs_s": [round(w, 3) for w in walls],
               "merged_mib": round(out.stat().st_size / 2**20, 2)}
        # rank traces of the last window, fetched as the CLI does
        c = ProbeClient(Endpoint(url), timeout=30)
        last = [a for a in c.actions()["actions"] if a["kind"] == "profile"][-1]["id"]
        c.profile_trace(last, str(tmp / "real0.json"))
    finally:
        (tmp / "stop").touch()
        try:
            job.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, 9)
            job.wait(10)
    # 16 simulated ranks: the biggest real trace we have, renumbered
    src = max(PROFILE_TRACES or [str(tmp / "real0.json")], key=os.path.getsize)
    traces = []
    for r in range(16):
        p = tmp / f"sim{r}.json"
        shutil.copy(src, p)
        traces.append(RankTrace(rank=r, path=str(p), window_start=time.time(),
                                clock_offset_s=r * 1e-4))
    timed = {}
    for workers in (1, os.cpu_count() or 1):  # one process, and as the CLI does (every core)
        t0 = time.perf_counter()
        rep = merge_traces(traces, str(tmp / "merged16.json"), workers=workers, overwrite=True)
        timed[workers] = time.perf_counter() - t0
    src_mib = round(os.path.getsize(src) / 2**20, 2)
    shutil.rmtree(tmp, ignore_errors=True)
    return {"two_ranks": two, "sixteen_ranks": {
        "source_trace_mib": src_mib, "merged_mib": round(rep.bytes / 2**20, 2),
        "events": sum(rep.events.values()),
        **{f"merge_s_workers_{w}": round(t, 3) for w, t in timed.items()},
        **{f"mib_per_s_workers_{w}": round(rep.bytes / 2**20 / t, 1) for w, t in timed.items()}}}


#: Rank traces written by --part profile (kept for the 16-rank merge).
PROFILE_TRACES: list[str] = []
#: The agents' run dirs, removed at the end.
TEMP_DIRS: list[str] = []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", default="profile,sampler,merge")
    ap.add_argument("--sizes", default="small,large")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--window", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--sampler-rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    parts = args.part.split(",")
    report: dict[str, object] = {}
    if "profile" in parts:
        report["profile"] = []
        for size in args.sizes.split(","):
            rounds = args.rounds if size == "small" else max(2, args.rounds // 2)
            report["profile"].append(run_profile(size, rounds, args.block, args.steps))
            print(json.dumps(report["profile"][-1]), flush=True)
    if "sampler" in parts:
        report["sampler"] = run_sampler("small", args.sampler_rounds, args.window, args.rate)
        print(json.dumps(report["sampler"]), flush=True)
    if "merge" in parts:
        report["merge"] = run_merge(args.repeats)
        print(json.dumps(report["merge"]), flush=True)
    for d in TEMP_DIRS:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
