"""The agent's footprint over a bare training process, part by part: RSS and threads.

Each stage runs in a fresh process (so a part's memory is not hidden by what an earlier part
freed), and each stage is the one before plus one part:

- ``bare``: Python with torch imported and one step of a small MLP run (torch's own pools up);
- ``imports``: + the modules the agent imports (probe_agent's agent, store, serving, collectors;
  duckdb, pyarrow, fastapi, uvicorn), nothing started;
- ``duckdb``: + the agent's Store (the in-memory DuckDB connection, the schema, the writer);
- ``agent``: the whole agent started instead (server, collectors, their threads), no watchdog;
- ``retention``: + the step tables filled past ``PROBE_RETENTION_MB`` (synthetic torch_trace
  rows, flushed and trimmed by the writer), i.e. the steady state of a long run;
- ``watchdog``: the agent with its watchdog; the watchdog process's own RSS is reported apart.

Reported per stage: the median over ``--reps`` of RSS (MiB) and threads, the min-max, and the
increment over the stage before; then the total over ``bare`` against the goal (64 MiB, 6
threads; watchdog 16 MiB). Measurement only. On a shared machine RSS is stable but the numbers
should still be re-taken on a quiet one.

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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("bare", "imports", "duckdb", "agent", "retention", "watchdog")
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


def _fill(agent: object, retention_mb: int) -> int:
    """Append synthetic torch_trace rows worth 1.5x the retention budget; returns the rows."""
    import numpy as np
    import pyarrow as pa

    from probe_agent.store.retention import step_table_widths

    store = agent.store  # type: ignore[attr-defined]
    table = "python.torch_trace"
    schema = store.arrow_schema(table)
    width = step_table_widths(store._columns)[table]
    rows = int(1.5 * retention_mb * 1024 * 1024 / width)
    per_step, chunk = 200, 50_000  # ~200 modules a step, like a small transformer
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        idx = np.arange(start, start + n)
        cols = []
        for f in schema:
            t = f.type
            if f.name == "step":
                cols.append(pa.array(idx // per_step, t))
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
        import duckdb  # noqa: F401
        import fastapi  # noqa: F401
        import pyarrow  # noqa: F401
        import uvicorn  # noqa: F401

        import probe_agent
        import probe_agent.process  # noqa: F401
        import probe_agent.collectors.registry  # noqa: F401
        import probe_agent.store.store
        from probe_agent.config import AgentConfig
        run_dir = os.path.join(os.environ["BENCH_FOOTPRINT_DIR"], "run")
        config = AgentConfig(port=0, watchdog=name == "watchdog", retention_mb=retention_mb,
                             trace_native="off", run_dir=run_dir)
        if name == "duckdb":
            probe_agent.store.store.Store(config).start()
        elif name in ("agent", "retention", "watchdog"):
            agent = probe_agent.start(config)
            if name == "retention":
                out["rows_appended"] = _fill(agent, retention_mb)
            if name == "watchdog":
                pid = (agent.info().watchdog or {}).get("pid")
                deadline = time.monotonic() + 30
                while pid is None and time.monotonic() < deadline:
                    time.sleep(0.1)
                    pid = (agent.info().watchdog or {}).get("pid")
                time.sleep(2)  # the watchdog's own imports done
                out["watchdog_mib"] = _status(pid)[0] if pid else None
    time.sleep(1)  # threads started lazily have started
    out["rss_mib"], out["threads"] = _status()
    return out


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
    prev = None
    for s in STAGES:
        rss = [float(r["rss_mib"]) for r in got[s]]
        thr = [int(r["threads"]) for r in got[s]]
        row = {"stage": s, "rss_mib": statistics.median(rss), "rss_range": (min(rss), max(rss)),
               "threads": statistics.median(thr), "threads_range": (min(thr), max(thr))}
        base = table[STAGES.index("agent")] if s in ("retention", "watchdog") else prev
        row["plus_mib"] = row["rss_mib"] - base["rss_mib"] if base else 0.0
        row["plus_threads"] = row["threads"] - base["threads"] if base else 0
        if s == "watchdog":
            wd = [float(r["watchdog_mib"]) for r in got[s] if r.get("watchdog_mib")]
            row["watchdog_mib"] = statistics.median(wd) if wd else None
        table.append(row)
        prev = row if s != "duckdb" else table[STAGES.index("imports")]
    bare = table[0]
    total = {"rss_over_bare_mib": table[4]["rss_mib"] - bare["rss_mib"],
             "threads_over_bare": table[3]["threads"] - bare["threads"],
             "watchdog_mib": table[5].get("watchdog_mib"),
             "goal": {"rss_mib": GOAL_MIB, "threads": GOAL_THREADS,
                      "watchdog_mib": GOAL_WATCHDOG_MIB}}
    if args.json:
        print(json.dumps({"stages": table, "total": total}, indent=1))
        return
    print(f"{'stage':<10} {'RSS MiB':>8} {'(min-max)':>14} {'+MiB':>7} {'threads':>8} {'+thr':>5}")
    for r in table:
        lo, hi = r["rss_range"]
        print(f"{r['stage']:<10} {r['rss_mib']:>8.1f} {f'({lo:.0f}-{hi:.0f})':>14} "
              f"{r['plus_mib']:>+7.1f} {r['threads']:>8.0f} {r['plus_threads']:>+5.0f}")
    print("(imports: over bare; duckdb and agent: over imports; retention and watchdog: over agent)")
    print(f"agent at full retention over bare: {total['rss_over_bare_mib']:+.1f} MiB "
          f"(goal <= {GOAL_MIB}); agent threads over bare: {total['threads_over_bare']:+.0f} "
          f"(goal <= {GOAL_THREADS}); watchdog process: {total['watchdog_mib'] or float('nan'):.1f}"
          f" MiB (goal <= {GOAL_WATCHDOG_MIB})")


if __name__ == "__main__":
    main()
