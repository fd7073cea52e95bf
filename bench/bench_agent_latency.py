"""Latency of backtrace, query and eval against a live training process, and the agent's cost
in RSS and threads.

Runs tests/programs/toy_train.py twice side by side: once with PROBE=1 (the .pth auto-start),
once without, and reports:
- median and p90 of N calls per endpoint over one keep-alive HTTP connection;
- RSS of the training process with the agent, without it, and the difference;
- the number of threads the agent adds.

    python bench/bench_agent_latency.py [--calls 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "programs" / "toy_train.py"
BACKTRACE_SQL = "SELECT func, file, lineno, depth FROM python.backtrace ORDER BY depth LIMIT 10"


def start(ready: Path, probe: bool) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE")}
    env["PYTHONPATH"] = str(ROOT)
    if probe:
        env.update(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(ready / "run"))
    return subprocess.Popen(
        [sys.executable, str(PROGRAM), "--ready-dir", str(ready),
         "--stop-file", str(ready / "stop")],
        env=env, start_new_session=True,
    )


def wait_ready(ready: Path, timeout: float = 60) -> dict:
    path = ready / "rank0.json"
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"training program did not become ready within {timeout} s")
        time.sleep(0.05)
    time.sleep(1.0)  # let a few steps run so RSS has settled
    return json.loads(path.read_text())


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("VmRSS", "Threads"):
            out[key] = int(val.split()[0])
    return out


def timed(fn, n: int) -> list[float]:
    fn()  # warm
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = fn()
        samples.append((time.perf_counter() - t0) * 1e3)
        assert r.status_code == 200, r.text
    return samples


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="probe-bench-") as d:
        with_dir, without_dir = Path(d, "with"), Path(d, "without")
        with_dir.mkdir(), without_dir.mkdir()
        procs = [start(with_dir, True), start(without_dir, False)]
        try:
            info = wait_ready(with_dir)
            wait_ready(without_dir)
            c = httpx.Client(base_url=info["url"], timeout=30)
            results = {
                "backtrace": timed(lambda: c.get("/v1/backtrace"), args.calls),
                "query": timed(
                    lambda: c.post("/v1/query", json={"sql": BACKTRACE_SQL}),
                    args.calls,
                ),
                "eval": timed(lambda: c.post("/v1/eval", json={"code": "trainer.current_step"}),
                              args.calls),
            }
            with_s, without_s = proc_status(procs[0].pid), proc_status(procs[1].pid)
        finally:
            for p, dd in zip(procs, (with_dir, without_dir)):
                (dd / "stop").touch()
            for p in procs:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)
    print(f"{'endpoint':<10} {'median ms':>10} {'p90 ms':>8}  "
          f"(n={args.calls}, keep-alive, TCP_NODELAY)")
    for name, s in results.items():
        s.sort()
        print(f"{name:<10} {statistics.median(s):>10.2f} {s[int(len(s) * 0.9)]:>8.2f}")
    print(f"RSS with agent {with_s['VmRSS'] / 1024:.1f} MiB, "
          f"without {without_s['VmRSS'] / 1024:.1f} MiB, "
          f"agent adds {(with_s['VmRSS'] - without_s['VmRSS']) / 1024:.1f} MiB")
    print(f"threads with agent {with_s['Threads']}, without {without_s['Threads']}, "
          f"agent adds {with_s['Threads'] - without_s['Threads']}")


if __name__ == "__main__":
    main()
