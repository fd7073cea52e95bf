"""Soak: 100k traced steps of a small model; RSS and DuckDB size must stay flat under the cap.

Runs in-process with the agent (tracing every module on every step, PROBE_RETENTION_MB small so
retention works hard), samples the process RSS, DuckDB's memory and the rows kept every
--every steps, and reports the slope of each over the second half of the run (MiB per 10k
steps): flat means the slope is ~0.

    python bench/bench_soak.py [--steps 100000] [--retention-mb 16]
"""

from __future__ import annotations

import argparse
import time


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs) or 1.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--every", type=int, default=5_000)
    ap.add_argument("--retention-mb", type=int, default=16)
    args = ap.parse_args()

    import torch
    import torch.nn as nn

    import probe_agent
    from probe_agent.config import AgentConfig

    torch.set_num_threads(1)
    agent = probe_agent.start(AgentConfig(port=0, watchdog=False, unix_socket=False, trace="on",
                                          retention_mb=args.retention_mb))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    samples: list[tuple[int, float, float, int]] = []
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if step % args.every == 0:
            agent.store.flush()
            db = agent.store.query(
                "SELECT sum(memory_usage_bytes) / 1048576.0 FROM duckdb_memory()")
            rows = agent.store.query("SELECT count(*) FROM python.torch_trace")
            samples.append((step, rss_mib(), float(db.rows[0][0] or 0), int(rows.rows[0][0])))
            _, rss, duck, nrows = samples[-1]
            print(f"step {step:>7}  rss {rss:7.1f} MiB  duckdb {duck:6.1f} MiB  "
                  f"torch_trace rows {nrows:>8}  {time.perf_counter() - t0:6.1f} s", flush=True)
    probe_agent.stop()
    half = samples[len(samples) // 2:]
    xs = [s[0] / 10_000 for s in half]
    print(f"\n{args.steps} steps in {time.perf_counter() - t0:.0f} s; "
          "second-half slopes per 10k steps: "
          f"RSS {slope(xs, [s[1] for s in half]):+.2f} MiB, "
          f"DuckDB {slope(xs, [s[2] for s in half]):+.2f} MiB, "
          f"rows {slope(xs, [float(s[3]) for s in half]):+.0f}")


if __name__ == "__main__":
    main()
