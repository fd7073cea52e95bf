"""What a hostile query or eval costs a running training job (issue 20, items 1, 2 and 7).

Starts tests/programs/toy_train.py with the agent (defaults, watchdog off so the requests reach
the agent itself), then, one after the other, a quiet window (the baseline) and each attack:

- ``sql_10mb``: a 10 MB ``SELECT 1+1+…`` (froze training 23 s before the SQL cap);
- ``in_1m``: a 1M-item ``IN`` list;
- ``repeat_400mb``: ``SELECT repeat('x', 400000000)``;
- ``chr1_60mb``: 60 MB of ``chr(1)`` (JSON escaping makes it 360 MB);
- ``spill_join``: a hash join over ``range(150M)`` (DuckDB spilled to ``<cwd>/.tmp``);
- ``pull_4x``: 4 clients pulling 100 MB results for ``--pull-s`` seconds;
- ``surrogate``: a lone surrogate in a query and in an eval body.

For each window it prints the answer (HTTP status, truncated, bytes), the stall ratio (longest
step in the window / median step of the quiet window: the training thread's own step times from
python.steps), the median-step ratio, the training process's peak RSS and its RSS 3 s after the
window over the baseline, and the peak bytes of files under the job's cwd. Both arms run in one
job, side by side, so the ratios compare like with like. The machine is shared: run it twice.

    python bench/bench_request_bounds.py [--pull-s 15] [--only sql_10mb,in_1m]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "programs" / "toy_train.py"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def disk_mb(path: Path) -> float:
    total = 0
    for p in path.rglob("*"):
        try:
            total += p.stat().st_size if p.is_file() else 0
        except OSError:  # a temp file removed while we look
            pass
    return total / 1e6


class RssSampler:
    """Peak RSS of ``pid`` and peak bytes under ``cwd`` over a window, sampled every 10 ms."""

    def __init__(self, pid: int, cwd: Path) -> None:
        self.pid, self.cwd, self.peak, self.disk = pid, cwd, 0.0, 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_mb(self.pid))
                self.disk = max(self.disk, disk_mb(self.cwd))
            except OSError:
                return
            self._stop.wait(0.01)

    def __enter__(self) -> RssSampler:
        self.peak = rss_mb(self.pid)
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def post(url: str, path: str, content: bytes, timeout: float = 120) -> tuple[int, dict, int]:
    """(status, small summary of the body, body bytes); the body is streamed, never kept."""
    n, head = 0, b""
    with httpx.stream("POST", url + path, content=content, timeout=timeout,
                      headers={"content-type": "application/json"}) as r:
        for chunk in r.iter_bytes():
            if len(head) < 600:
                head += chunk[:600]
            n += len(chunk)
        status = r.status_code
    text = head.decode(errors="replace")
    summary: dict = {}
    for key in ("truncated", "error"):
        i = text.find(f'"{key}":')
        if i >= 0:
            summary[key] = text[i + len(key) + 3:i + len(key) + 160].split('","')[0]
    return status, summary, n


def sql(url: str, text: str) -> tuple[int, dict, int]:
    return post(url, "/v1/query", json.dumps({"sql": text}).encode())


def attacks(pull_s: float) -> dict[str, object]:
    def sql_10mb(url: str) -> list:
        return [sql(url, "SELECT 1" + "+1" * (5 * 1024 * 1024))]

    def in_1m(url: str) -> list:
        return [sql(url, "SELECT 1 IN (" + ",".join(str(i) for i in range(1_000_000)) + ")")]

    def repeat_400mb(url: str) -> list:
        return [sql(url, "SELECT repeat('x', 400000000) AS s")]

    def chr1_60mb(url: str) -> list:
        return [sql(url, "SELECT repeat(chr(1), 60000000) AS s")]

    def spill_join(url: str) -> list:
        return [sql(url, "SELECT count(*) FROM range(150000000) a(x) JOIN range(150000000) "
                         "b(y) ON a.x = b.y")]

    def pull_4x(url: str) -> list:
        out: list = []
        stop = time.monotonic() + pull_s

        def client() -> None:
            while time.monotonic() < stop:
                out.append(sql(url, "SELECT repeat('x', 100000) AS s FROM range(1000)"))

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    def surrogate(url: str) -> list:
        return [post(url, "/v1/query", b'{"sql": "SELECT \'\\udcff\'"}'),
                post(url, "/v1/eval", b'{"code": "\'\\udcff\'"}')]

    return {f.__name__: f for f in (sql_10mb, in_1m, repeat_400mb, chr1_60mb, spill_join,
                                     pull_4x, surrogate)}


def step_times(url: str) -> list[tuple[float, float]]:
    """(end_time, duration between consecutive step ends) for every step so far."""
    r = httpx.post(url + "/v1/query", json={
        "sql": "SELECT end_time FROM python.steps ORDER BY step", "max_rows": 10_000_000},
        timeout=180)  # it may queue behind the attacks' debt to the serving budget
    assert r.status_code == 200 and not r.json()["truncated"], r.text[:300]
    ends = [row[0] for row in r.json()["rows"]]
    return [(b, b - a) for a, b in zip(ends, ends[1:])]


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pull-s", type=float, default=15.0)
    ap.add_argument("--quiet-s", type=float, default=5.0)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    chosen = attacks(args.pull_s)
    if args.only:
        chosen = {k: v for k, v in chosen.items() if k in args.only.split(",")}
    with tempfile.TemporaryDirectory(prefix="probe-bounds-") as d:
        tmp = Path(d)
        cwd = tmp / "cwd"
        cwd.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE")}
        env.update(PYTHONPATH=str(ROOT), PROBE="1", PROBE_PORT="0", PROBE_WATCHDOG="0",
                   PROBE_RUN_DIR=str(tmp / "run"), PROBE_TRACE="off", PROBE_TRACE_NATIVE="off",
                   PROBE_MAX_ROWS="1000000")  # step_times reads every step
        log = open(tmp / "train.log", "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [sys.executable, str(PROGRAM), "--ready-dir", str(tmp), "--stop-file",
             str(tmp / "stop")], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
            start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while not (tmp / "rank0.json").exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    print("training did not start:", (tmp / "train.log").read_text()[-3000:])
                    return 1
                time.sleep(0.05)
            url = json.loads((tmp / "rank0.json").read_text())["url"]
            sql(url, "SELECT 1")
            time.sleep(2.0)  # past start-up (imports, first steps)
            windows: list[tuple[str, float, float, list, float, float, float]] = []
            base_rss = rss_mb(proc.pid)
            t0 = time.time()
            with RssSampler(proc.pid, cwd) as s:
                time.sleep(args.quiet_s)
            windows.append(("quiet", t0, time.time(), [], s.peak, rss_mb(proc.pid), s.disk))
            for name, fn in chosen.items():
                t0 = time.time()
                with RssSampler(proc.pid, cwd) as s:
                    answers = fn(url)  # type: ignore[operator]
                    time.sleep(0.5)  # the step that was running when the answer came
                t1 = time.time()
                time.sleep(3.0)  # DuckDB's allocator thread gives freed memory back in ~2 s
                windows.append((name, t0, t1, answers, s.peak, rss_mb(proc.pid), s.disk))
            steps = step_times(url)
            alive = proc.poll() is None
        finally:
            (tmp / "stop").touch()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(5)
            log.close()
        quiet = [dt for end, dt in steps if windows[0][1] <= end <= windows[0][2]]
        median = statistics.median(quiet)
        print(f"baseline: {len(quiet)} steps, median step {median * 1e3:.1f} ms, "
              f"RSS {base_rss:.0f} MB; training alive after all attacks: {alive}")
        print(f"{'window':<13} {'answers':<44} {'stall':>7} {'median':>7} "
              f"{'peak RSS':>9} {'RSS +3s':>9}  peak MB under cwd")
        for name, a, b, answers, peak, after, disk in windows:
            dts = [dt for end, dt in steps if a <= end <= b + 0.5]
            stall = max(dts) / median if dts else float("nan")
            med = statistics.median(dts) / median if dts else float("nan")
            statuses: dict[str, int] = {}
            for status, summary, n in answers:
                key = f"{status}" + (" trunc" if summary.get("truncated", "").startswith("true")
                                     else "") + f" {n / 1e6:.1f}MB"
                if len(answers) > 4:
                    key = f"{status} {n / 1e6:.0f}MB"
                statuses[key] = statuses.get(key, 0) + 1
            shown = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in statuses.items()) or "-"
            print(f"{name:<13} {shown[:44]:<44} {stall:7.2f} {med:7.2f} "
                  f"{peak - base_rss:+8.0f}M {after - base_rss:+8.0f}M  "
                  f"{disk:.0f}")
        for name, a, b, answers, *_ in windows:
            for status, summary, n in answers[:2]:
                if summary.get("error"):
                    print(f"  {name}: {status} {summary['error'][:150]}")
        print("files under cwd at the end:", files_under(cwd)[:10] or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
