"""`probe ui` costs (issue 15): the job's step time with the dashboard open, and one refresh
at 64 ranks.

1. **ratio**: a 2-rank torchrun job (tests/programs/toy_train.py, gloo, agent in both arms)
   runs alternating blocks: ON = a `probe ui` process with its page polled at the page's own
   rate (GET /api/snapshot every 1.5 s, what the browser does; the browser itself runs on the
   operator's machine, not here), OFF = no dashboard at all. The first ``--settle`` seconds of
   each block are left out. Step times come from python.steps of both ranks (one query at the
   end). Reported: median step of each block, and ON/OFF as the ratio of the medians of the
   block medians (side by side, same job, same machine).
2. **scale**: ``--ranks`` real agent processes (bench_fanout's, tracing off, listing each
   other as a c10d store would), then the dashboard's refresh through probe_cli's own
   Snapshotter: the per-refresh round (backtrace + collectives + one query per rank, hang
   verdict, tiles) and the slow round (doctor's second round + straggler, every 8th refresh),
   plus GET /api/snapshot of the cached result from the dashboard's HTTP server.

Usage::

    python bench/bench_ui.py --blocks 6 --block-s 20 --ranks 64
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_fanout import free_base, start_agents, stop_agents  # noqa: E402

from probe_cli.transport.fanout import fan_out, resolve_ranks  # noqa: E402
from probe_cli.transport.session import Session  # noqa: E402
from probe_cli.transport.targets import Endpoint  # noqa: E402
from probe_cli.ui.server import DashboardServer  # noqa: E402
from probe_cli.ui.snapshot import Snapshotter  # noqa: E402


def _start_ui(agent: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "probe_cli", "-t", agent, "--timeout", "5",
                             "ui", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    m = re.search(r"(http://\S+)", proc.stdout.readline())
    if not m:
        raise RuntimeError("probe ui did not print its URL")
    return proc, m.group(1)


def _owner_client(url: str) -> tuple[httpx.Client, str]:
    """A client holding the dashboard's cookie (the secret in the printed URL) and sending the
    page's key header (as the page's JS does), and the base."""
    c = httpx.Client(timeout=10, follow_redirects=True)
    page = c.get(url).text
    key = re.search(r'name="probe-ui-key" content="([^"]+)"', page)
    if key:  # a checkout from before the key header has none
        c.headers["X-Probe-UI-Key"] = key.group(1)
    return c, url.split("?", 1)[0]


def _poll(url: str, stop: threading.Event) -> None:
    c, base = _owner_client(url)
    try:
        while not stop.wait(1.5):
            c.get(base + "api/snapshot")
    finally:
        c.close()


def ratio(blocks: int, block_s: float, settle: float) -> None:
    from tests.e2e.test_cluster import torchrun_job

    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp, \
            torchrun_job(Path(tmp), "toy_train.py", 2) as (_, infos):
        agent = infos[0]["url"].removeprefix("http://")
        windows: list[tuple[str, float, float]] = []
        for b in range(blocks):
            arm = "on" if b % 2 == 0 else "off"
            ui = stop = poller = None
            if arm == "on":
                ui, url = _start_ui(agent)
                stop = threading.Event()
                poller = threading.Thread(target=_poll, args=(url, stop), daemon=True)
                poller.start()
            t0 = time.time()
            time.sleep(block_s)
            windows.append((arm, t0 + settle, time.time()))
            if ui is not None:
                stop.set()
                poller.join()
                ui.send_signal(signal.SIGTERM)
                ui.wait(15)
        session = Session(endpoints=[Endpoint(infos[0]["url"])], timeout=30)
        try:
            res = fan_out(session, resolve_ranks(session), lambda c, _t: c.query(
                "SELECT end_time, duration FROM python.steps WHERE duration IS NOT NULL",
                max_rows=1_000_000))
        finally:
            session.close()
        rows = [row for r in res if r.ok for row in r.data["rows"]]
    med = {"on": [], "off": []}
    for arm, lo, hi in windows:
        d = [dur for end, dur in rows if lo <= end < hi]
        m = statistics.median(d)
        med[arm].append(m)
        print(f"block {arm:3s}: {len(d):5d} steps, median {m * 1e3:.2f} ms", flush=True)
    r = statistics.median(med["on"]) / statistics.median(med["off"])
    print(f"step-time ratio dashboard open / none: {r:.4f} "
          f"({blocks} alternating blocks of {block_s:.0f} s, first {settle:.0f} s of each "
          "left out)")


def scale(n: int, repeat: int) -> None:
    base = free_base(n)
    t0 = time.perf_counter()
    procs = start_agents(n, base, 16)
    print(f"# {n} agents started in {time.perf_counter() - t0:.1f} s", flush=True)
    try:
        session = Session(endpoints=[Endpoint(f"http://127.0.0.1:{base}")], timeout=30)
        snaps = Snapshotter(session)
        fast, slow, during = [], [], []
        snaps.refresh_once(slow=True)  # warm: discovery, first-request imports in each agent
        for _ in range(repeat):
            t = time.perf_counter()
            snap = snaps.refresh_once(slow=False)
            fast.append(time.perf_counter() - t)
        for _ in range(2):  # as the live page: the slow round on its thread, refreshes go on
            t_slow = time.perf_counter()
            snaps.refresh_once(slow=True, wait_slow=False)
            while snaps.slow_thread.is_alive():
                t = time.perf_counter()
                snaps.refresh_once(slow=False)
                during.append(time.perf_counter() - t)
            slow.append(time.perf_counter() - t_slow)
        tiles = len(snap["tiles"])
        server = DashboardServer("127.0.0.1", 0, snaps)
        server.serve_in_thread()
        c, base = _owner_client(server.url)
        gets = []
        try:
            for _ in range(repeat):
                t = time.perf_counter()
                body = c.get(base + "api/snapshot").content
                gets.append(time.perf_counter() - t)
        finally:
            c.close()
        server.shutdown()
        server.server_close()
        session.close()
        print(f"{n} ranks ({tiles} tiles): per-refresh round median "
              f"{statistics.median(fast) * 1e3:.0f} ms (max {max(fast) * 1e3:.0f}); while a "
              f"slow round runs {statistics.median(during or [0]) * 1e3:.0f} ms; "
              f"slow round (doctor+straggler, every 8th) median "
              f"{statistics.median(slow) * 1e3:.0f} ms; GET /api/snapshot "
              f"{statistics.median(gets) * 1e3:.1f} ms ({len(body) / 1024:.0f} KiB)")
        print(json.dumps({"ranks": n, "refresh_ms": [round(x * 1e3) for x in fast],
                          "during_slow_ms": [round(x * 1e3) for x in during],
                          "slow_ms": [round(x * 1e3) for x in slow]}))
    finally:
        stop_agents(procs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=6, help="alternating ON/OFF blocks (even)")
    ap.add_argument("--block-s", type=float, default=20.0)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--ranks", type=int, default=64, help="agents for the refresh timing (0: skip)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--skip-ratio", action="store_true")
    args = ap.parse_args()
    if not args.skip_ratio:
        ratio(args.blocks, args.block_s, args.settle)
    if args.ranks:
        scale(args.ranks, args.repeat)


if __name__ == "__main__":
    main()
