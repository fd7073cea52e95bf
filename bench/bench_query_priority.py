"""How much a heavy query stretches training steps, with the agent's SQL threads at idle priority
(probe_agent/cpu_priority.py), at nice 10 (the canned diagnostics' level) and at normal
priority, side by side in one process.

One process: the agent (both arms load it), a training loop on the main thread (matmuls on
``--torch-threads`` threads, every core by default), and in alternating blocks one heavy query
(``--rows`` rows of DuckDB work, seconds, which releases the GIL) sent over HTTP to the agent.
Per block: the median step before the query, the median and longest step while it runs, and how
long it took. Reported per arm: the stretch ratios (during / before) as the range over blocks,
and their median.

    sudo python bench/bench_query_priority.py --blocks 6

Root, because the baseline arm puts the SQL threads back to normal priority (an unprivileged
thread cannot leave SCHED_IDLE where RLIMIT_NICE is 0).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(os.environ.get("PROBE_SRC") or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=6, help="blocks per arm, alternating")
    ap.add_argument("--rows", type=int, default=40_000_000)
    ap.add_argument("--torch-threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    import httpx
    import torch

    import probe_agent
    from probe_agent import cpu_priority
    from probe_agent.config import AgentConfig

    torch.set_num_threads(args.torch_threads)
    run_dir = tempfile.mkdtemp(prefix="probe-prio-")
    agent = probe_agent.start(AgentConfig(port=0, watchdog=False, run_dir=run_dir,
                                          trace_native="off", query_timeout_ms=120_000))
    sql = f"SELECT sum(hash(range)) AS s FROM range({args.rows})"
    a = torch.randn(384, 384)

    def step() -> float:
        t0 = time.perf_counter()
        for _ in range(25):
            a @ a
        return time.perf_counter() - t0

    arms = ("idle", "nice", "normal")
    results: dict[str, list[tuple[float, float, float]]] = {a: [] for a in arms}
    try:
        with httpx.Client(base_url=agent.url, timeout=300) as c:
            c.post("/v1/query", json={"sql": "SELECT 1"})
            for block in range(len(arms) * args.blocks):
                arm = arms[block % len(arms)]
                cpu_priority.ENABLED = arm != "normal"
                agent.sql_pool._background = "nice" if arm == "nice" else "idle"
                before = [step() for _ in range(30)]
                done = threading.Event()
                took: list[float] = []

                def ask() -> None:
                    t0 = time.perf_counter()
                    r = c.post("/v1/query", json={"sql": sql})
                    took.append(time.perf_counter() - t0)
                    assert r.status_code == 200, r.text
                    done.set()

                threading.Thread(target=ask, daemon=True).start()
                during = []
                while not done.is_set():
                    during.append(step())
                med = statistics.median(before)
                results[arm].append((statistics.median(during) / med, max(during) / med,
                                     took[0]))
                print(f"block {block} {arm:6}: step {med * 1e3:.0f} ms before; during the "
                      f"query median x{results[arm][-1][0]:.2f}, longest "
                      f"x{results[arm][-1][1]:.2f}; query {took[0]:.1f} s", flush=True)
    finally:
        probe_agent.stop()
    print(f"code under test: {ROOT}; {os.cpu_count()} cores, torch threads "
          f"{args.torch_threads}; query: {sql}")
    for arm, rows in results.items():
        meds, longs, took = zip(*rows)
        print(f"{arm:6} SQL threads: median step during the query x{min(meds):.2f}..x"
              f"{max(meds):.2f} (median x{statistics.median(meds):.2f}); longest step "
              f"x{min(longs):.2f}..x{max(longs):.2f} (median x{statistics.median(longs):.2f}); "
              f"query {min(took):.1f}..{max(took):.1f} s")


if __name__ == "__main__":
    main()
