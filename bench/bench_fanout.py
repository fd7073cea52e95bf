"""Fan-out latency of the CLI against many agents on loopback (issue 4, "Scale").

Starts N lightweight agents (one process each: ``probe_agent`` with tracing off, no torch, no
unix socket), each listening on BASE + r and advertising every other one in ``/v1/ranks`` (the
list a job's c10d store would give). Then, from one target address, as ``probe -t HOST:BASE``
does, it times:

- ``backtrace``: discovery (``GET /v1/ranks`` on the target) + ``GET /v1/backtrace`` on every
  rank, through probe_cli's own fan-out (``resolve_ranks`` + ``fan_out``);
- ``query``: the same with ``POST /v1/query`` (``SELECT count(*) FROM python.backtrace``: each
  agent materialises its stacks);
- ``cli``: the whole ``python -m probe_cli -t HOST:BASE --json backtrace`` subprocess (start-up,
  imports and printing included).

Each is measured ``--repeat`` times with a fresh session (new connections, as a new CLI
invocation has) and reported as median and min.

Usage::

    python bench/bench_fanout.py --ranks 8,64,256 --repeat 5
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from probe_cli.transport.fanout import fan_out, resolve_ranks  # noqa: E402
from probe_cli.transport.session import Session  # noqa: E402
from probe_cli.transport.targets import Endpoint  # noqa: E402

AGENT = r"""
import os, sys, threading
import probe_agent
from probe_agent.config import AgentConfig
agent = probe_agent.start(AgentConfig(port=int(os.environ["PROBE_PORT"]) + int(os.environ["RANK"]),
                                      trace="off", unix_socket=False, watchdog=False))
base, n = int(os.environ["PROBE_PORT"]), int(os.environ["WORLD_SIZE"])
# What the c10d-store registry would have read back in a real job.
agent.peers = {r: {"rank": r, "url": f"http://127.0.0.1:{base + r}", "host": "bench",
                   "pid": 0} for r in range(n)}
print("ready", flush=True)
threading.Event().wait()
"""


def free_base(n: int, start: int = 21000) -> int:
    """A base port with ``n`` consecutive free ports after it."""
    base = start
    while base + n < 65000:
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    base = p + 1
                    break
        else:
            return base
    raise RuntimeError(f"no {n} consecutive free ports")


def start_agents(n: int, base: int, batch: int) -> list[subprocess.Popen[str]]:
    procs: list[subprocess.Popen[str]] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE")}
    env.update(PYTHONPATH=str(ROOT), PROBE_PORT=str(base), WORLD_SIZE=str(n), OMP_NUM_THREADS="1")
    for lo in range(0, n, batch):  # in batches: 2 cores cannot import 256 interpreters at once
        wave = []
        for r in range(lo, min(n, lo + batch)):
            wave.append(subprocess.Popen(
                [sys.executable, "-c", AGENT], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                start_new_session=True,
            ))
        for p in wave:
            line = p.stdout.readline() if p.stdout else ""
            if line.strip() != "ready":
                raise RuntimeError(f"agent exited: rc={p.poll()}")
        procs.extend(wave)
    return procs


def stop_agents(procs: list[subprocess.Popen[str]]) -> None:
    """Kill every agent process group (start_agents made each a session leader) and reap it."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait(10)


def rss_mib(procs: list[subprocess.Popen[str]]) -> float:
    total = 0
    for p in procs:
        try:
            for line in Path(f"/proc/{p.pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def timed_fanout(base: int, call: object, n: int) -> float:
    session = Session(endpoints=[Endpoint(f"http://127.0.0.1:{base}")], timeout=30.0)
    try:
        t0 = time.perf_counter()
        results = fan_out(session, resolve_ranks(session), call)  # type: ignore[arg-type]
        elapsed = time.perf_counter() - t0
    finally:
        session.close()
    ok = sum(r.ok for r in results)
    if ok != n:
        raise RuntimeError(f"only {ok}/{n} ranks answered")
    return elapsed


def timed_cli(base: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE")}
    env["PYTHONPATH"] = str(ROOT)
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "probe_cli", "-t", f"127.0.0.1:{base}", "--timeout", "30",
         "--json", "backtrace"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    elapsed = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"probe exited {out.returncode}: {out.stderr[-500:]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="8,64", help="comma-separated agent counts")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16, help="agents started at once")
    args = ap.parse_args()
    rows = []
    for n in [int(x) for x in args.ranks.split(",")]:
        base = free_base(n)
        t0 = time.perf_counter()
        procs = start_agents(n, base, args.batch)
        started = time.perf_counter() - t0
        try:
            mem = rss_mib(procs)
            calls = {
                "backtrace": lambda c, t: c.backtrace(),
                "query": lambda c, t: c.query("SELECT count(*) AS frames FROM python.backtrace"),
            }
            for name, call in calls.items():
                timed_fanout(base, call, n)  # warm: first-request imports inside each agent
                times = [timed_fanout(base, call, n) for _ in range(args.repeat)]
                rows.append((n, name, statistics.median(times), min(times)))
            if importlib.util.find_spec("probe_cli.main") is not None:
                times = [timed_cli(base) for _ in range(max(1, args.repeat // 2))]
                rows.append((n, "cli backtrace (subprocess)", statistics.median(times),
                             min(times)))
            print(f"# {n} agents started in {started:.1f} s, {mem:.0f} MiB PSS in all",
                  flush=True)
        finally:
            stop_agents(procs)
    print(f"{'ranks':>6} {'what':<28} {'median ms':>10} {'min ms':>8}")
    for n, name, med, lo in rows:
        print(f"{n:>6} {name:<28} {med * 1e3:>10.1f} {lo * 1e3:>8.1f}")


if __name__ == "__main__":
    main()
