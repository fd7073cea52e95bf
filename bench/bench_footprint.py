"""The agent's footprint over a bare training process, part by part: RSS and threads.

Each stage runs in a fresh process (so a part's memory is not hidden by what an earlier part
freed), and each stage is the one before plus one part:

- ``bare``: Python with torch imported and one step of a small MLP run (torch's own pools up);
- ``imports``: + the modules the agent imports (probe_agent's agent, store, serving, collectors;
  duckdb, pyarrow, fastapi, uvicorn), nothing started;
- ``duckdb``: + the agent's Store (the in-memory DuckDB connection, the schema, the writer);
- ``agent``: the whole agent started instead (server, collectors, their threads), no watchdog;
- ``served``: the agent after a burst of 16 queries from 8 clients at once and a backtrace,
  measured once the request threads had 12 s to end (``burst_threads``: right after it);
- ``retention``: the agent with the step tables filled past ``PROBE_RETENTION_MB`` three times
  over (synthetic torch_trace rows of ever newer steps, flushed, trimmed and reclaimed by the
  writer), i.e. the steady state of a long run; ``table_mib`` is DuckDB's own count;
- ``watchdog``: the agent with its watchdog; the watchdog process is reported apart: RSS, and
  its private memory (what it adds to the node: the rest is the interpreter's and libraries'
  file pages, which the rank maps too).

Reported per stage: the median over ``--reps`` of RSS (MiB), anonymous memory (MiB: RSS less
the file-backed pages of the libraries, which the node's ranks share and the kernel can drop),
and threads, with the increment over the stage before. Then the agent's fixed cost over
``bare`` against the goal (64 MiB, 6 threads; watchdog 16 MiB), and the tables at full
retention apart: they are what PROBE_RETENTION_MB asks for. Measurement only; on a shared
machine RSS is stable but the numbers should still be re-taken on a quiet one.

    python bench/bench_footprint.py [--reps 3] [--retention-mb 128] [--json]
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

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("bare", "imports", "duckdb", "agent", "served", "retention", "watchdog")
GOAL_MIB, GOAL_THREADS, GOAL_WATCHDOG_MIB = 64, 6, 16


def _status(pid: int | str = "self") -> tuple[float, int]:
    """(RSS in MiB, threads) of ``pid`` from /proc."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss / 1024, threads


def _rollup(pid: int | str = "self") -> dict[str, float]:
    """Anonymous, private and proportional memory (MiB) of ``pid``, from smaps_rollup."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("Anonymous", "Pss", "Private_Dirty", "Private_Clean"):
                out[key] = int(line.split()[1]) / 1024
    return {"anon_mib": out.get("Anonymous", 0.0), "pss_mib": out.get("Pss", 0.0),
            "private_mib": out.get("Private_Dirty", 0.0) + out.get("Private_Clean", 0.0)}


def _fill(agent: object, retention_mb: int, first_step: int = 0) -> int:
    """Append synthetic torch_trace rows worth 1.5x the retention budget, from ``first_step``
    on; returns the rows."""
    import numpy as np
    import pyarrow as pa

    from probe_agent.store.retention import step_table_widths

    store = agent.store  # type: ignore[attr-defined]
    table = "python.torch_trace"
    schema = store.arrow_schema(table)
    width = step_table_widths(store._columns)[table]
    rows = int(1.5 * retention_mb * 1024 * 1024 / width)
    # ~200 modules a step, like a small transformer; batches of about what a flush carries
    per_step, chunk = 200, 4096
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        idx = np.arange(start, start + n)
        cols = []
        for f in schema:
            t = f.type
            if f.name == "step":
                cols.append(pa.array(first_step + idx // per_step, t))
            elif pa.types.is_integer(t):
                cols.append(pa.array(idx % 1000, t))
            elif pa.types.is_floating(t):
                cols.append(pa.array(np.random.default_rng(start).random(n), t))
            elif pa.types.is_string(t):
                cols.append(pa.array([f"blocks.{i % per_step}.mlp" for i in idx], t))
            elif pa.types.is_boolean(t):
                cols.append(pa.array(idx % 2 == 0, t))
            else:
                cols.append(pa.nulls(n, t))
        store.append(table, pa.Table.from_arrays(cols, schema=schema))
    store.flush(timeout=300)
    return rows


def stage(name: str, retention_mb: int) -> dict[str, object]:
    """Run in a child: build the stage, then measure this process (and the watchdog)."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model(torch.randn(8, 64)).sum().backward()
    out: dict[str, object] = {}
    if name != "bare":
        # the store first: it loads pyarrow the agent's way (store/arrow_import.py)
        import duckdb  # noqa: F401
        import fastapi  # noqa: F401
        import pyarrow  # noqa: F401
        import uvicorn  # noqa: F401

        import probe_agent
        import probe_agent.collectors.registry  # noqa: F401
        import probe_agent.process  # noqa: F401
        import probe_agent.serving.server  # noqa: F401
        import probe_agent.store.store
        from probe_agent.config import AgentConfig
        run_dir = os.path.join(os.environ["BENCH_FOOTPRINT_DIR"], "run")
        config = AgentConfig(port=0, watchdog=name == "watchdog", retention_mb=retention_mb,
                             trace_native="off", run_dir=run_dir)
        if name == "duckdb":
            probe_agent.store.store.Store(config).start()
        elif name in ("agent", "served", "retention", "watchdog"):
            agent = probe_agent.start(config)
            if name == "served":
                out["burst_threads"] = _serve_burst(agent)
                time.sleep(12)  # request threads end after 10 s idle (serving/idle_pool.py)
            if name == "retention":
                rows = 0
                for r in range(3):  # three budgets of ever newer steps: a long run's state
                    rows += _fill(agent, retention_mb, first_step=r * 1_000_000)
                    time.sleep(2.5)  # the writer's retention pass runs at most every 2 s
                    agent.store.flush(timeout=300)
                out["rows_appended"] = rows
                out["table_mib"] = agent.store.query(
                    "SELECT coalesce(sum(memory_usage_bytes), 0) / 2^20 FROM duckdb_memory() "
                    "WHERE tag = 'IN_MEMORY_TABLE'").rows[0][0]
                time.sleep(3)  # DuckDB's allocator thread returns freed pages within ~2 s
            if name == "watchdog":
                pid = (agent.info().watchdog or {}).get("pid")
                deadline = time.monotonic() + 30
                while pid is None and time.monotonic() < deadline:
                    time.sleep(0.1)
                    pid = (agent.info().watchdog or {}).get("pid")
                time.sleep(2)  # the watchdog's own imports done
                if pid:
                    out["watchdog_mib"] = _status(pid)[0]
                    out["watchdog_private_mib"] = _rollup(pid)["private_mib"]
    time.sleep(1)  # threads started lazily have started
    out["rss_mib"], out["threads"] = _status()
    out.update(_rollup())
    out["thread_names"] = sorted(t.name for t in threading.enumerate())
    return out


_BURST = r"""
import sys
from concurrent.futures import ThreadPoolExecutor
import httpx
url = sys.argv[1]
def one(sql):
    with httpx.Client(base_url=url, timeout=60) as c:
        return c.post("/v1/query", json={"sql": sql}).status_code
sqls = ["SELECT module, count(*) FROM torch_trace GROUP BY 1", "SELECT * FROM steps"] * 8
with ThreadPoolExecutor(8) as ex:
    codes = list(ex.map(one, sqls))
with httpx.Client(base_url=url, timeout=60) as c:
    codes.append(c.get("/v1/backtrace").status_code)
print(sorted(set(codes)))
"""


def _serve_burst(agent: object) -> int:
    """16 queries from 8 clients at once and a backtrace over HTTP, from another process (so
    the client's own imports and threads stay out of the measure); the threads right after."""
    proc = subprocess.run([sys.executable, "-c", _BURST, agent.url],  # type: ignore[attr-defined]
                          capture_output=True, text=True, timeout=300)
    if proc.stdout.strip() != "[200]":
        raise SystemExit(f"served: requests failed: {proc.stdout} {proc.stderr[-2000:]}")
    return _status()[1]


def run(name: str, retention_mb: int) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env = {k: v for k, v in env.items() if not k.startswith("PROBE")}
    # a short run dir (unix socket paths stay under 108 bytes), removed after the stage
    env["BENCH_FOOTPRINT_DIR"] = tempfile.mkdtemp(prefix="probe-bfp-", dir="/tmp")
    try:
        proc = subprocess.run([sys.executable, __file__, "--stage", name,
                               "--retention-mb", str(retention_mb)],
                              capture_output=True, text=True, env=env, timeout=900)
    finally:
        shutil.rmtree(env["BENCH_FOOTPRINT_DIR"], ignore_errors=True)
    if proc.returncode != 0:
        sys.exit(f"stage {name} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--retention-mb", type=int, default=128)
    ap.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.stage:
        print(json.dumps(stage(args.stage, args.retention_mb)))
        os._exit(0)  # measured: do not wait for the agent's shutdown
    got = {s: [run(s, args.retention_mb) for _ in range(args.reps)] for s in STAGES}
    table = []
    for s in STAGES:
        row: dict[str, object] = {"stage": s}
        for key in ("rss_mib", "anon_mib", "threads", "burst_threads", "table_mib",
                    "watchdog_mib", "watchdog_private_mib"):
            vals = [float(r[key]) for r in got[s] if r.get(key) is not None]
            if vals:
                row[key] = statistics.median(vals)
                row[key + "_range"] = (min(vals), max(vals))
        table.append(row)
    by = {r["stage"]: r for r in table}
    over = {"imports": "bare", "duckdb": "imports", "agent": "imports", "served": "agent",
            "retention": "agent", "watchdog": "agent"}
    for r in table:
        base = by.get(over.get(r["stage"], ""))
        for key in ("rss_mib", "anon_mib", "threads"):
            r["plus_" + key] = r[key] - base[key] if base else 0.0
    bare, agent = by["bare"], by["agent"]
    fixed = max(by["agent"]["rss_mib"], by["served"]["rss_mib"]) - bare["rss_mib"]
    total = {"fixed_rss_over_bare_mib": fixed,
             "fixed_anon_over_bare_mib": max(agent["anon_mib"], by["served"]["anon_mib"])
             - bare["anon_mib"],
             "threads_over_bare": max(agent["threads"], by["served"]["threads"]) - bare["threads"],
             "burst_threads_over_bare": by["served"].get("burst_threads", 0) - bare["threads"],
             "retention_rss_mib": by["retention"]["rss_mib"] - agent["rss_mib"],
             "retention_table_mib": by["retention"].get("table_mib"),
             "retention_mb": args.retention_mb,
             "watchdog_mib": by["watchdog"].get("watchdog_mib"),
             "watchdog_private_mib": by["watchdog"].get("watchdog_private_mib"),
             "goal": {"rss_mib": GOAL_MIB, "threads": GOAL_THREADS,
                      "watchdog_mib": GOAL_WATCHDOG_MIB}}
    if args.json:
        print(json.dumps({"stages": table, "total": total}, indent=1))
        return
    print(f"{'stage':<10} {'RSS MiB':>8} {'(min-max)':>12} {'+MiB':>7} {'anon':>7} {'+anon':>7} "
          f"{'threads':>8} {'+thr':>5}")
    for r in table:
        lo, hi = r["rss_mib_range"]
        print(f"{r['stage']:<10} {r['rss_mib']:>8.1f} {f'({lo:.0f}-{hi:.0f})':>12} "
              f"{r['plus_rss_mib']:>+7.1f} {r['anon_mib']:>7.1f} {r['plus_anon_mib']:>+7.1f} "
              f"{r['threads']:>8.0f} {r['plus_threads']:>+5.0f}")
    print("(imports: over bare; duckdb and agent: over imports; served, retention and watchdog: "
          "over agent)")
    print(f"agent's fixed cost over bare: {total['fixed_rss_over_bare_mib']:+.1f} MiB RSS, "
          f"{total['fixed_anon_over_bare_mib']:+.1f} MiB anonymous (goal <= {GOAL_MIB}); threads "
          f"{total['threads_over_bare']:+.0f} idle, {total['burst_threads_over_bare']:+.0f} "
          f"right after a burst (goal <= {GOAL_THREADS})")
    print(f"tables at full retention (PROBE_RETENTION_MB={args.retention_mb}, what was asked "
          f"for): {total['retention_rss_mib']:+.1f} MiB RSS over the agent, DuckDB counts "
          f"{total['retention_table_mib'] or float('nan'):.1f} MiB of tables")
    print(f"watchdog process: {total['watchdog_mib'] or float('nan'):.1f} MiB RSS, "
          f"{total['watchdog_private_mib'] or float('nan'):.1f} MiB private "
          f"(goal <= {GOAL_WATCHDOG_MIB})")


if __name__ == "__main__":
    main()
