"""What one request costs the training process: serving-thread CPU per request, per endpoint.

Starts an agent in this process (tracing off, no serving budget), sends each request 200 times
after 20 warm-ups, and divides the CPU the agent's serving threads used (their own CPU clocks:
uvicorn's loop, the query and eval pools, the eval thread) by the count. This is the figure
PROBE_SERVE_CPU budgets: at the default 0.02 of a core, 1 ms per request is 20 requests/s.

    python bench/bench_request_cost.py [--n 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import httpx

import probe_agent
from probe_agent.config import AgentConfig
from probe_agent.serving.budget import ServeBudget

REQUESTS = {
    "health": ("GET", "/v1/health", None),
    "query SELECT 1": ("POST", "/v1/query", {"sql": "SELECT 1"}),
    "query backtrace": ("POST", "/v1/query",
                        {"sql": "SELECT func, count(*) FROM python.backtrace GROUP BY ALL"}),
    "backtrace": ("GET", "/v1/backtrace", None),
    "eval": ("POST", "/v1/eval", {"code": "1 + 1"}),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    run_dir = tempfile.mkdtemp(prefix="probe-cost-")
    agent = probe_agent.start(AgentConfig(port=0, watchdog=False, serve_cpu=1.0, trace="off",
                                          run_dir=run_dir))
    meter = ServeBudget(0.5)  # used only for its clock over the serving threads
    try:
        with httpx.Client(base_url=agent.url, timeout=30) as c:
            for name, (method, path, body) in REQUESTS.items():
                for _ in range(20):
                    c.request(method, path, json=body)
                meter.cpu_since_last()
                t0 = time.perf_counter()
                for _ in range(args.n):
                    assert c.request(method, path, json=body).status_code == 200
                cpu = meter.cpu_since_last() / args.n * 1e3
                wall = (time.perf_counter() - t0) / args.n * 1e3
                print(f"{name:<16} {cpu:6.2f} ms serving CPU per request  {wall:6.2f} ms wall")
    finally:
        probe_agent.stop()


if __name__ == "__main__":
    main()
