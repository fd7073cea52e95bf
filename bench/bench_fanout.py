"""Fan-out latency of the CLI from one address: flat (one request per rank) against the per-node
tree (one request per node, ``POST /v1/node/fanout``), 8 to 1,024 ranks.

Default mode, ``--sim``: simulated ranks (tests/simranks.py: the real HTTP parsing, access
rule, wire bodies, signed rank list and the watchdog's node relay over real unix sockets; the
training processes are fake, 8 ranks a node, nodes spread over ``--procs`` processes). From
``127.0.0.1:BASE`` (rank 0), with a fresh session each time (new connections, as a new CLI
invocation has), paired and interleaved (flat, tree, tree, flat, ...), it times:

- ``backtrace``: discovery (``GET /v1/ranks``) + every rank's ``GET /v1/backtrace``;
- ``query``: the same with ``POST /v1/query`` (``SELECT count(*) FROM python.backtrace``,
  run in DuckDB by each simulated rank);
- ``cli``: the whole ``python -m probe_cli -t HOST:BASE --json backtrace`` subprocess (which
  uses the tree), with its peak RSS (``wait4``'s ``ru_maxrss``).

``--real`` is the earlier bench: N real agent processes (``probe_agent`` with tracing off, no
torch, ~55 MiB each), flat fan-out only, up to ~256 on this VM.

Usage::

    python bench/bench_fanout.py --ranks 8,64,256,1024 --repeat 5
    python bench/bench_fanout.py --real --ranks 8,64 --repeat 5
    python bench/bench_fanout.py --query-rows 1000 --ranks 64,256,1024 --repeat 3 \\
        --baseline-root /path/to/older/checkout
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from probe_cli.transport.fanout import fan_out, resolve_ranks  # noqa: E402
from probe_cli.transport.nodetree import NodeCall, fan_out_nodes  # noqa: E402
from probe_cli.transport.session import Session  # noqa: E402
from probe_cli.transport.targets import Endpoint  # noqa: E402
from tests import simranks  # noqa: E402

QUERY = "SELECT count(*) AS frames FROM python.backtrace"

AGENT = r"""
import json, os, sys, threading
import probe_agent
from probe_agent.config import AgentConfig
from probe_protocol.bodies import RankEntry
tree = os.environ.get("BENCH_TREE") == "1"
extra = {"run_dir": os.environ["BENCH_RUN_DIR"], "watchdog_grace_s": 0.5} if tree else {}
agent = probe_agent.start(AgentConfig(port=int(os.environ["PROBE_PORT"]) + int(os.environ["RANK"]),
                                      trace="off", unix_socket=tree, watchdog=tree, **extra))
base, n = int(os.environ["PROBE_PORT"]), int(os.environ["WORLD_SIZE"])
print("ready", flush=True)
# What the c10d-store registry would have read back in a real job (the bench sends the pids).
pids = json.loads(sys.stdin.readline())
agent.peers = {r: RankEntry(r, f"http://127.0.0.1:{base + r}", agent.identity.host, pids[r])
               for r in range(n)}
print("peers", flush=True)
threading.Event().wait()
"""


free_base = simranks.free_base  # one port scan for the simulator and the real agents


def start_agents(n: int, base: int, batch: int, run_dir: str | None = None
                 ) -> list[subprocess.Popen[str]]:
    """``n`` agents on BASE + r; with ``run_dir``, each with its unix socket and watchdog."""
    procs: list[subprocess.Popen[str]] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE")}
    env.update(PYTHONPATH=str(ROOT), PROBE_PORT=str(base), WORLD_SIZE=str(n), OMP_NUM_THREADS="1")
    if run_dir:
        env.update(BENCH_TREE="1", BENCH_RUN_DIR=run_dir)
    for lo in range(0, n, batch):  # in batches: 2 cores cannot import 256 interpreters at once
        wave = []
        for r in range(lo, min(n, lo + batch)):
            wave.append(subprocess.Popen(
                [sys.executable, "-c", AGENT], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, start_new_session=True,
            ))
        procs.extend(wave)
        for p in wave:
            line = p.stdout.readline() if p.stdout else ""
            if line.strip() != "ready":
                stop_agents(procs)
                raise RuntimeError(f"agent exited: rc={p.poll()}")
    pids = json.dumps([p.pid for p in procs]) + "\n"
    for p in procs:
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(pids)
        p.stdin.flush()
        if p.stdout.readline().strip() != "peers":
            stop_agents(procs)
            raise RuntimeError(f"agent exited: rc={p.poll()}")
    return procs


stop_agents = simranks.stop  # kill each process group and reap it, as for the simulator


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


def timed_fanout(base: int, call: object, n: int, node: NodeCall | None = None) -> float:
    """Seconds for discovery + one answer from every rank; ``node``: through the tree."""
    session = Session(endpoints=[Endpoint(f"http://127.0.0.1:{base}")], timeout=30.0)
    try:
        t0 = time.perf_counter()
        targets = resolve_ranks(session)
        if node is None:
            results = fan_out(session, targets, call)  # type: ignore[arg-type]
        else:
            results = fan_out_nodes(session, targets, call, node)  # type: ignore[arg-type]
        elapsed = time.perf_counter() - t0
    finally:
        session.close()
    ok = sum(r.ok for r in results)
    if ok != n:
        raise RuntimeError(f"only {ok}/{n} ranks answered")
    return elapsed


def timed_cli(base: int, command: tuple[str, ...] = ("backtrace",),
              root: Path = ROOT) -> tuple[float, float]:
    """Seconds and peak RSS (MiB) of one ``probe --json COMMAND`` subprocess, run from the
    checkout at ``root``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE")}
    env["PYTHONPATH"] = str(root)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "probe_cli", "-t", f"127.0.0.1:{base}", "--timeout", "30",
         "--json", *command],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
        cwd=root,  # `-m` puts the working directory first on sys.path, before PYTHONPATH
    )
    err = proc.stderr.read() if proc.stderr else b""
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.stderr:
        proc.stderr.close()
    if proc.returncode != 0:
        raise RuntimeError(f"probe exited {proc.returncode}: {err[-500:]!r}")
    return elapsed, usage.ru_maxrss / 1024


def real_main(args: argparse.Namespace) -> None:
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
                times = [timed_cli(base)[0] for _ in range(max(1, args.repeat // 2))]
                rows.append((n, "cli backtrace (subprocess)", statistics.median(times),
                             min(times)))
            print(f"# {n} agents started in {started:.1f} s, {mem:.0f} MiB PSS in all",
                  flush=True)
        finally:
            stop_agents(procs)
    print(f"{'ranks':>6} {'what':<28} {'median ms':>10} {'min ms':>8}")
    for n, name, med, lo in rows:
        print(f"{n:>6} {name:<28} {med * 1e3:>10.1f} {lo * 1e3:>8.1f}")


def cpu_s(procs: list[subprocess.Popen[str]]) -> float:
    """CPU seconds (user + system) the processes have used so far."""
    ticks = 0
    for p in procs:
        fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:7.0f} [{min(xs) * 1e3:.0f}-{max(xs) * 1e3:.0f}]"


CALLS = {
    "backtrace": (lambda c, t: c.backtrace(), NodeCall("backtrace", {})),
    "query": (lambda c, t: c.query(QUERY), NodeCall("query", {"sql": QUERY})),
}


def paired(base: int, procs: list[Any], n: int, repeat: int, rows: list[Any],
           cpu_rows: list[Any]) -> None:
    """Flat and tree, interleaved (flat, tree, tree, flat, ...), with the CPU each run cost
    the serving processes (``procs``) and this client."""
    for name, (call, node) in CALLS.items():
        timed_fanout(base, call, n)  # warm both paths once
        timed_fanout(base, call, n, node)
        flat: list[float] = []
        tree: list[float] = []
        cpu: dict[str, list[tuple[float, float]]] = {"flat": [], "tree": []}
        for i in range(repeat):
            arms = [(flat, None, "flat"), (tree, node, "tree")]
            for times, how, arm in (arms if i % 2 == 0 else arms[::-1]):
                s0, c0 = cpu_s(procs), time.process_time()
                times.append(timed_fanout(base, call, n, how))
                cpu[arm].append((cpu_s(procs) - s0, time.process_time() - c0))
        rows.append((n, name, flat, tree))
        for arm, xs in cpu.items():
            cpu_rows.append((n, name, arm, statistics.median(x[0] for x in xs),
                             statistics.median(x[1] for x in xs)))


def children(procs: list[subprocess.Popen[str]]) -> list[Any]:
    """The processes' direct children (the agents' watchdogs), as objects with a ``pid``."""
    out = []
    for p in procs:
        try:
            kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
        except OSError:
            continue
        out += [type("Child", (), {"pid": int(k)})() for k in kids]
    return out


def report(rows: list[Any], cpu_rows: list[Any]) -> None:
    print(f"{'ranks':>6} {'what':<22} {'flat ms median [min-max]':>26} "
          f"{'tree ms median [min-max]':>26} {'tree/flat':>9}")
    for n, name, flat, tree in rows:
        if name.startswith("cli"):  # the second list holds the peak RSS (MiB) here
            print(f"{n:>6} {name:<22} {spread(flat):>26} {'peak RSS':>12} "
                  f"{statistics.median(tree):7.0f} MiB")
            continue
        ratio = statistics.median(tree) / statistics.median(flat)
        print(f"{n:>6} {name:<22} {spread(flat):>26} {spread(tree):>26} {ratio:>9.2f}")
    # Where the time goes: the serving processes share this machine's cores, so their CPU is a
    # floor on the wall time here (it runs in parallel across nodes on a cluster); the
    # client's CPU is what the CLI itself pays.
    print(f"{'ranks':>6} {'what':<22} {'arm':<5} {'ranks CPU ms':>13} {'client CPU ms':>14}")
    for n, name, arm, server, client in cpu_rows:
        print(f"{n:>6} {name:<22} {arm:<5} {server * 1e3:>13.0f} {client * 1e3:>14.0f}")


def real_tree_main(args: argparse.Namespace) -> None:
    """Flat against tree on real agents, each with its watchdog and unix socket: one host,
    so the tree is one node request that rank 0's watchdog relays to every rank."""
    rows: list[Any] = []
    cpu_rows: list[Any] = []
    for n in [int(x) for x in args.ranks.split(",")]:
        run_dir = tempfile.mkdtemp(prefix="probe-bench-run-")
        os.chmod(run_dir, 0o700)
        base = free_base(n)
        procs = start_agents(n, base, args.batch, run_dir)
        try:
            dogs = children(procs)
            paired(base, [*procs, *dogs], n, args.repeat, rows, cpu_rows)
            print(f"# {n} agents and {len(dogs)} watchdogs, "
                  f"{rss_mib([*procs, *dogs]):.0f} MiB PSS in all", flush=True)
        finally:
            stop_agents(procs)
            for d in dogs:  # their own sessions: not in the agents' process groups
                try:
                    os.kill(d.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            shutil.rmtree(run_dir, ignore_errors=True)
    report(rows, cpu_rows)


def sim_main(args: argparse.Namespace) -> None:
    """Flat against tree on simulated ranks, paired and interleaved."""
    rows = []
    cpu_rows: list[tuple[int, str, str, float, float]] = []
    for n in [int(x) for x in args.ranks.split(",")]:
        root = tempfile.mkdtemp(prefix="probe-simranks-")
        os.chmod(root, 0o700)
        nodes = -(-n // args.per_node)
        t0 = time.perf_counter()
        base, procs = simranks.start(root, n, args.per_node, min(args.procs, nodes))
        started = time.perf_counter() - t0
        try:
            paired(base, procs, n, args.repeat, rows, cpu_rows)
            cli = [timed_cli(base) for _ in range(max(1, args.repeat // 2))]
            rows.append((n, "cli --json backtrace", [c[0] for c in cli], [c[1] for c in cli]))
            print(f"# {n} simulated ranks ({nodes} nodes) in {min(args.procs, nodes)} "
                  f"processes, started in {started:.1f} s, {rss_mib(procs):.0f} MiB PSS",
                  flush=True)
        finally:
            simranks.stop(procs)
            shutil.rmtree(root, ignore_errors=True)
    report(rows, cpu_rows)


def query_rss_main(args: argparse.Namespace) -> None:
    """``probe --json query`` returning ``--query-rows`` rows of ~100 bytes from every rank:
    the CLI's peak RSS and time, this checkout against ``--baseline-root`` (an older checkout,
    e.g. before the output was streamed), interleaved on the same simulated job."""
    sql = (f"SELECT i, getvariable('sim_rank') AS r, repeat('x', 96) AS pad "
           f"FROM range({args.query_rows}) t(i)")
    arms = [("this", ROOT)] + ([("baseline", Path(args.baseline_root))]
                               if args.baseline_root else [])
    print("| ranks | rows/rank | arm | seconds, median [min-max] | peak RSS MiB, median "
          "[min-max] |\n| --- | --- | --- | --- | --- |")
    for n in [int(x) for x in args.ranks.split(",")]:
        root = tempfile.mkdtemp(prefix="probe-simranks-")
        os.chmod(root, 0o700)
        base, procs = simranks.start(root, n, args.per_node, min(args.procs, -(-n // 8)))
        try:
            got: dict[str, list[tuple[float, float]]] = {a: [] for a, _ in arms}
            for i in range(args.repeat):
                for name, checkout in (arms if i % 2 == 0 else arms[::-1]):
                    got[name].append(timed_cli(base, ("query", "--max-rows",
                                                      str(args.query_rows), sql), checkout))
            for name, runs in got.items():
                secs, rss = sorted(r[0] for r in runs), sorted(r[1] for r in runs)
                print(f"| {n} | {args.query_rows} | {name} | {statistics.median(secs):.2f} "
                      f"[{secs[0]:.2f}-{secs[-1]:.2f}] | {statistics.median(rss):.0f} "
                      f"[{rss[0]:.0f}-{rss[-1]:.0f}] |", flush=True)
        finally:
            simranks.stop(procs)
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="8,64", help="comma-separated rank counts")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--real", action="store_true",
                    help="real agent processes, flat fan-out only (the earlier bench)")
    ap.add_argument("--tree", action="store_true",
                    help="with --real: agents with watchdogs, flat against the tree")
    ap.add_argument("--batch", type=int, default=16, help="--real: agents started at once")
    ap.add_argument("--per-node", type=int, default=8, help="simulated ranks per node")
    ap.add_argument("--procs", type=int, default=4, help="simulator processes")
    ap.add_argument("--query-rows", type=int, default=0,
                    help="measure `probe --json query` returning this many rows a rank")
    ap.add_argument("--baseline-root", default=None,
                    help="with --query-rows: an older checkout to run side by side")
    args = ap.parse_args()
    if args.query_rows:
        query_rss_main(args)
    elif args.real:
        (real_tree_main if args.tree else real_main)(args)
    else:
        sim_main(args)


if __name__ == "__main__":
    main()
