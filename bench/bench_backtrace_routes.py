"""Backtrace latency per route, the watchdog's memory, and `probe inject` timings (issue 5).

Run: ``.venv/bin/python bench/bench_backtrace_routes.py [--n 20] [--json]``

Routes measured (median and p90 of N ``GET /v1/backtrace`` over TCP, keep-alive):

- ``in-process via watchdog``: the normal path (client -> watchdog proxy -> agent);
- ``in-process direct``: the agent's private socket, no proxy (the proxy's cost is the gap);
- ``py-spy (GIL held)``: the main thread spins in C holding the GIL; the watchdog answers;
- ``faulthandler (GIL held)``: the same with PROBE_WATCHDOG_READER=faulthandler (no ptrace);
- ``deadline (first request of a freeze)``: the one request that waits the full
  PROBE_BACKTRACE_DEADLINE_MS before the heartbeat goes stale.

Then the watchdog's RSS (VmRSS, and PSS from smaps_rollup) and N inject -> stop cycles into a
plain training loop: how long the hijacked thread was stopped, the injector's wall time, and
the time until the agent answered.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.procs import kill_all, spawn, spin_library, wait_json  # noqa: E402
from tests.support import wait_until  # noqa: E402


def stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median_ms": round(statistics.median(xs), 2),
            "p90_ms": round(xs[int(0.9 * (len(xs) - 1))], 2), "n": len(xs)}


def timed(client: httpx.Client, path: str = "/v1/backtrace") -> tuple[float, dict]:
    t0 = time.perf_counter()
    body = client.get(path).json()
    return (time.perf_counter() - t0) * 1e3, body


def rss_kb(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                out["rss_kb"] = int(line.split()[1])
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    out["pss_kb"] = int(line.split()[1])
    except OSError:
        pass
    return out


def gil_target(tmp: Path, reader: str, spin_s: float):
    lib = spin_library(tmp)
    ready, go, done = tmp / "ready.json", tmp / "go", tmp / "done"
    proc = spawn("gil_holder.py", ["--lib", lib, "--ready-file", str(ready), "--go-file", str(go),
                                   "--done-file", str(done), "--spin-s", str(spin_s)],
                 tmp / "run", PROBE_WATCHDOG="1", PROBE_WATCHDOG_READER=reader,
                 PROBE_WATCHDOG_GRACE_S="2")
    return proc, wait_json(ready, proc), go, done


def bench_routes(n: int, out: dict) -> None:
    with tempfile.TemporaryDirectory(prefix="probe-bench-") as d:
        tmp = Path(d)
        proc, info, go, done = gil_target(tmp, "auto", spin_s=max(6.0, n * 0.25))
        try:
            with httpx.Client(base_url=info["url"], timeout=10) as c:
                timed(c)
                out["in-process via watchdog"] = stats([timed(c)[0] for _ in range(n)])
                inner = tmp / "run" / f"{info['pid']}.agent"
                with httpx.Client(transport=httpx.HTTPTransport(uds=str(inner)),
                                  base_url="http://x", timeout=10) as ci:
                    out["in-process direct (no proxy)"] = stats([timed(ci)[0] for _ in range(n)])
                wd = json.loads((tmp / "run" / f"{info['pid']}.watchdog.json").read_text())
                out["watchdog_memory"] = rss_kb(wd["watchdog_pid"])
                go.touch()
                wait_until(lambda: not go.exists(), 10, "no C call")
                first, body = timed(c)
                out["deadline (first request of a freeze)"] = {"ms": round(first, 1),
                                                              "source": body.get("source")}
                xs = []
                for _ in range(n):
                    ms, body = timed(c)
                    assert body["source"] == "out-of-process", body
                    xs.append(ms)
                out["py-spy (GIL held)"] = stats(xs)
                wait_until(done.exists, 60, "C call did not end")
        finally:
            kill_all(proc, tmp / "run")
    with tempfile.TemporaryDirectory(prefix="probe-bench-") as d:
        tmp = Path(d)
        proc, info, go, done = gil_target(tmp, "faulthandler", spin_s=max(6.0, n * 0.2))
        try:
            with httpx.Client(base_url=info["url"], timeout=10) as c:
                go.touch()
                wait_until(lambda: not go.exists(), 10, "no C call")
                wait_until(lambda: timed(c)[1]["source"] == "out-of-process", 5, "no freeze")
                xs = []
                for _ in range(n):
                    ms, body = timed(c)
                    assert body["route"] == "faulthandler", body
                    xs.append(ms)
                out["faulthandler (GIL held)"] = stats(xs)
        finally:
            kill_all(proc, tmp / "run")


def bench_inject(n: int, out: dict) -> None:
    from probe_cli.injection import injector
    from probe_cli.injection.target import check_version, inspect
    from probe_cli.transport.local_socket import ask_socket

    with tempfile.TemporaryDirectory(prefix="probe-bench-") as d:
        tmp = Path(d)
        run = tmp / "run"
        run.mkdir(mode=0o700)
        stats_file = tmp / "stats.json"
        proc = spawn("plain_train.py", ["--stats-file", str(stats_file)], run)
        try:
            pid = wait_json(stats_file, proc)["pid"]
            stopped, wall, ready = [], [], []
            sock = str(run / f"{pid}.sock")
            for _ in range(n):
                status, script = run / f"{pid}.inject.json", run / f"{pid}.inject.py"
                status.unlink(missing_ok=True)
                deadline = time.time() + 30
                script.write_text(injector.bootstrap_source(
                    status_path=str(status), deadline=deadline, extra_paths=[],
                    env={"PROBE_PORT": "0", "PROBE_RUN_DIR": str(run), "PROBE_WATCHDOG": "0"}))
                t0 = time.perf_counter()
                target = inspect(pid)
                check_version(target)
                _, stop_ms = injector.inject_ptrace(target, injector.boot_line(str(script)))
                wall.append((time.perf_counter() - t0) * 1e3)
                stopped.append(stop_ms)
                st, waited = injector.wait_status(str(status), deadline, 60)
                assert st and st["state"] == "started", st
                ready.append(waited * 1e3)
                with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://x",
                                  timeout=10) as c:
                    stop = ("import threading, probe_agent; "
                            "threading.Timer(0.05, probe_agent.stop).start()")
                    c.post("/v1/eval", json={"code": stop})
                wait_until(lambda: not os.path.exists(sock), 20, "agent did not stop")
            assert ask_socket(sock) is None
            final = json.loads(stats_file.read_text())
            out["inject"] = {
                "thread_stopped": stats(stopped), "injector_wall (inspect+inject)": stats(wall),
                "agent_ready_after_inject": stats(ready[1:] or ready),
                "first_agent_ready_ms": round(ready[0], 1),
                "target_bad_numerics": final["bad"], "target_steps": final["steps"],
            }
        finally:
            kill_all(proc, run)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    out: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count(),
                 "loadavg_1m": os.getloadavg()[0]}
    bench_routes(args.n, out)
    bench_inject(max(5, args.n // 2), out)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for key, value in out.items():
        print(f"{key:40s} {value}")


if __name__ == "__main__":
    main()
