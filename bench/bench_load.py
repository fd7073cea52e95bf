"""Load: N concurrent clients mix query, backtrace and eval against a training process.

Runs docker/demo_train.py (a small GPT, single process) with the agent, then alternates phases in
one run: quiet (no clients) / loaded (N clients) / quiet, and reports
- the step-time ratio loaded / quiet (goal ≤ 1.05),
- p50 and p99 latency per endpoint,
- requests sent vs responses received (none may be lost).
Each client loops: pick an endpoint (query 40%, backtrace 40%, eval 20%), send, wait for the
answer, sleep --think seconds.

On a real cluster the clients run on other machines. Here they share the training process's 2
cores, so by default the load generator runs at nice 19 (``--client-nice``): it gets the CPU the
training process leaves, as a remote client would cost the node nothing. Its own CPU use is
reported, and so is the training process's CPU per step, quiet against loaded: the agent's real
cost, whichever process the scheduler favours.

Phases alternate (``--rounds`` pairs of quiet, then loaded), and the ratio is taken per round
against the quiet phase just before, so the machine's drift hits both sides alike.

    python bench/bench_load.py [--clients 50] [--seconds 60] [--rounds 6] [--client-nice 19]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "docker" / "demo_train.py"
REQUESTS = [
    ("query", 0.4,
     ("POST", "/v1/query", {"sql": "SELECT func, count(*) FROM python.backtrace GROUP BY ALL"})),
    ("backtrace", 0.4, ("GET", "/v1/backtrace", None)),
    ("eval", 0.2, ("POST", "/v1/eval", {"code": "trainer.current_step"})),
]


async def client_loop(
    c: httpx.AsyncClient, until: float, think: float, lat: dict, counts: dict
) -> None:
    rng = random.Random()
    while time.monotonic() < until:
        weights = [w for _, w, _ in REQUESTS]
        name, _, (method, path, body) = rng.choices(REQUESTS, weights=weights)[0]
        counts["sent"] += 1
        t0 = time.perf_counter()
        try:
            r = await c.request(method, path, json=body)
            counts["answered"] += 1
            if r.status_code != 200:
                counts["errors"] += 1
                counts.setdefault("error_kinds", []).append(
                    f"{name} {r.status_code} {r.text[:120]}")
        except httpx.HTTPError as e:
            counts["lost"] += 1
            counts.setdefault("lost_kinds", []).append(type(e).__name__)
        lat[name].append((time.perf_counter() - t0) * 1e3)
        await asyncio.sleep(think * rng.uniform(0.5, 1.5))


async def loaded_phase(url: str, clients: int, seconds: float, think: float) -> tuple[dict, dict]:
    lat: dict[str, list[float]] = {n: [] for n, _, _ in REQUESTS}
    counts = {"sent": 0, "answered": 0, "errors": 0, "lost": 0}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:
        until = time.monotonic() + seconds
        await asyncio.gather(*(client_loop(c, until, think, lat, counts) for _ in range(clients)))
    return lat, counts


def current_step(url: str) -> int:
    """The step clock (GET /v1/step is exempt from the serving budget, so reading it during a
    loaded phase does not queue behind the clients)."""
    body = httpx.get(f"{url}/v1/step", timeout=60).json()
    return int(body.get("step") or 0)


def proc_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--quiet-seconds", type=float, default=30,
                    help="quiet time in all, split over the rounds")
    ap.add_argument("--rounds", type=int, default=6,
                    help="quiet/loaded phase pairs, interleaved so drift hits both alike")
    ap.add_argument("--think", type=float, default=1.0)
    ap.add_argument("--watchdog", action="store_true",
                    help="run the agent's watchdog (the default in production): clients then "
                         "reach the rank through its out-of-process proxy")
    ap.add_argument("--serve-cpu", default=None,
                    help="PROBE_SERVE_CPU for the training process (default: the agent's, 0.02)")
    ap.add_argument("--client-nice", type=int, default=19,
                    help="niceness of the load generator (0: compete with training as equals)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="probe-load-") as d:
        tmp = Path(d)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE")}
        env.update(PYTHONPATH=str(ROOT), PROBE="1", PROBE_PORT="0",
                   PROBE_WATCHDOG="1" if args.watchdog else "0",
                   PROBE_RUN_DIR=str(tmp / "run"), PROBE_TRACE="off", OMP_NUM_THREADS="1")
        if args.serve_cpu is not None:
            env["PROBE_SERVE_CPU"] = args.serve_cpu
        proc = subprocess.Popen([sys.executable, str(PROGRAM), "--stop-file", str(tmp / "stop")],
                                env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while not list((tmp / "run").glob("*.json")) if (tmp / "run").exists() else True:
                if time.monotonic() > deadline:
                    raise SystemExit("agent did not start")
                time.sleep(0.1)
            url = None
            while url is None:  # <pid>.json (the watchdog writes <pid>.watchdog.json beside it)
                infos = [json.loads(f.read_text()) for f in (tmp / "run").glob("*.json")]
                url = next((i["url"] for i in infos if i.get("url")), None)
                if url is None and time.monotonic() > deadline:
                    raise SystemExit("agent did not start")
                time.sleep(0.1)
            os.nice(args.client_nice)  # the training process was started before: not niced
            while current_step(url) < 20:
                time.sleep(0.2)
            rounds = []  # (quiet s/step, quiet cpu/step, loaded s/step, loaded cpu/step)
            lat: dict[str, list[float]] = {}
            counts: dict = {"sent": 0, "answered": 0, "errors": 0, "lost": 0}
            b_cpu = b_wall = 0.0
            per_round = args.seconds / args.rounds
            for _ in range(args.rounds):
                s0, t0, c0 = current_step(url), time.monotonic(), proc_cpu_s(proc.pid)
                time.sleep(args.quiet_seconds / args.rounds)
                s1, t1, c1 = current_step(url), time.monotonic(), proc_cpu_s(proc.pid)
                b0 = time.process_time()
                # The loaded phase lasts until every client has its last answer (queued
                # requests included), so no request spills into the next quiet phase.
                lt, ct = asyncio.run(loaded_phase(url, args.clients, per_round, args.think))
                s2, t2, c2 = current_step(url), time.monotonic(), proc_cpu_s(proc.pid)
                b_cpu, b_wall = b_cpu + time.process_time() - b0, b_wall + t2 - t1
                for k, v in lt.items():
                    lat.setdefault(k, []).extend(v)
                for k, v in ct.items():
                    counts[k] = (counts.get(k, 0) + v if not isinstance(v, list)
                                 else [*counts.get(k, []), *v])
                n1, n2 = max(1, s1 - s0), max(1, s2 - s1)
                rounds.append(((t1 - t0) / n1, (c1 - c0) / n1, (t2 - t1) / n2, (c2 - c1) / n2))
                qw, qc, lw, lc = (x * 1e3 for x in rounds[-1])
                print(f"round: quiet {qw:.1f} ms (cpu {qc:.1f}), loaded {lw:.1f} ms "
                      f"(cpu {lc:.1f}), {t2 - t1:.0f} s", file=sys.stderr)
        finally:
            (tmp / "stop").touch()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
    ratios = sorted(r[2] / r[0] for r in rounds)
    cpu_ratios = sorted(r[3] / r[1] for r in rounds)
    quiet = statistics.median(r[0] for r in rounds)
    loaded = statistics.median(r[2] for r in rounds)
    print(f"PROBE_SERVE_CPU={args.serve_cpu or 'default (0.02)'} "
          f"clients={args.clients} seconds={args.seconds:g} in {args.rounds} rounds "
          f"think={args.think:g}s client nice={args.client_nice} (load generator used "
          f"{b_cpu / max(b_wall, 1e-9):.0%} of a core)")
    print(f"step time quiet {quiet * 1e3:.1f} ms, loaded {loaded * 1e3:.1f} ms; ratio per round "
          f"(loaded / the quiet phase before it): median {statistics.median(ratios):.3f} "
          f"[{', '.join(f'{r:.3f}' for r in ratios)}]")
    print("training process CPU per step, ratio per round: median "
          f"{statistics.median(cpu_ratios):.3f} [{', '.join(f'{r:.3f}' for r in cpu_ratios)}]")
    for name, xs in lat.items():
        xs.sort()
        if xs:
            p99 = xs[int(len(xs) * 0.99) - 1]
            print(f"{name:<10} n={len(xs):>5} p50 {statistics.median(xs):7.1f} ms  "
                  f"p99 {p99:7.1f} ms")
    print(f"requests sent {counts['sent']}, answered {counts['answered']} "
          f"(non-200: {counts['errors']}), lost {counts['lost']} "
          f"{sorted(set(counts.get('lost_kinds', [])))}")
    for kind in sorted(set(counts.get("error_kinds", [])))[:5]:
        print("  non-200:", kind)


if __name__ == "__main__":
    main()
