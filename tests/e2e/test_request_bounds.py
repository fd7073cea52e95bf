"""A training job under hostile queries (issue 20, items 1 and 2): a 10 MB statement, a 400 MB
value and a join that would spill get clear 4xx or truncated answers, the training process's
memory stays within +100 MB, nothing is written under its working directory, and it keeps
stepping. The stall figure (longest step / median step) is measured in
bench/bench_request_bounds.py, not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.support import PROGRAMS, kill_tree, python_env, wait_until

pytestmark = pytest.mark.e2e


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class FileWatch:
    """Every path seen under ``root`` while it runs, looked for every 20 ms (DuckDB's spill
    files come and go within a query)."""

    def __init__(self, root: Path) -> None:
        self.root, self.seen, self._stop = root, set(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.seen.update(str(p.relative_to(self.root)) for p in self.root.rglob("*"))

    def __enter__(self) -> FileWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def job(tmp_path: Path):
    """toy_train.py with the agent, its cwd an empty directory; yields (proc, url, cwd)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    ready = tmp_path / "ready"
    ready.mkdir()
    env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(tmp_path / "run"),
                     PROBE_WATCHDOG="0", PROBE_TRACE="off",
                     PROBE_SERVE_CPU="1")  # the serving budget is not under test here
    proc = subprocess.Popen(
        [sys.executable, str(PROGRAMS / "toy_train.py"), "--ready-dir", str(ready),
         "--stop-file", str(tmp_path / "stop")],
        env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        def up() -> bool:
            assert proc.poll() is None, f"training exited early:\n{proc.stdout.read()}"
            return (ready / "rank0.json").exists()

        wait_until(up, 60, "training did not become ready")
        yield proc, json.loads((ready / "rank0.json").read_text())["url"], cwd
    finally:
        (tmp_path / "stop").touch()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait(10)
        proc.stdout.close()


@pytest.mark.timeout(120)
def test_hostile_queries_get_clear_answers_and_training_keeps_going(job, request):
    proc, url, cwd = job
    c = httpx.Client(base_url=url, timeout=60)
    request.addfinalizer(c.close)

    def step() -> int:
        return int(c.post("/v1/eval", json={"code": "trainer.current_step"}).json()["result"])

    # GIVEN a job that has answered one query of each shape (first-use imports are not growth)
    assert c.post("/v1/query", json={"sql": "SELECT repeat('x', 100) FROM range(10)"}).is_success
    assert c.post("/v1/query", json={"sql": "SELECT 1"}, headers={
        "accept": "application/vnd.apache.arrow.stream"}).is_success
    before_rss, before_step = rss_mb(proc.pid), step()

    with FileWatch(cwd) as watch:
        # WHEN a 10 MB statement arrives
        big = c.post("/v1/query", json={"sql": "SELECT 1" + "+1" * (5 << 20)})
        # AND a query whose one value is 400 MB
        huge = c.post("/v1/query", json={"sql": "SELECT repeat('x', 400000000) AS s"})
        # AND a join that DuckDB would spill to <cwd>/.tmp
        join = c.post("/v1/query", json={
            "sql": "SELECT count(*) FROM range(150000000) a(x) JOIN range(150000000) b(y) "
                   "ON a.x = b.y"})
    after_step = step()
    # DuckDB's allocator hands freed memory back from a background thread within ~2 s
    try:
        wait_until(lambda: rss_mb(proc.pid) - before_rss < 100, 15, "RSS to settle")
    except AssertionError:
        pass  # reported by the assertion below, with the figures
    after_rss = rss_mb(proc.pid)
    out = f"\n10 MB: {big.text[:300]}\n400 MB: {huge.text[:300]}\njoin: {join.text[:300]}"

    # THEN each gets a clear answer: refused with the limit named, or cut and said so
    assert big.status_code == 413 and "PROBE_MAX_SQL_BYTES" in big.json()["error"], out
    if huge.status_code == 200:
        assert huge.json()["truncated"] is True and huge.json()["rows"] == [], out
    else:
        assert huge.status_code == 400 and "Out of Memory" in huge.json()["error"], out
    assert join.status_code in (400, 408) and "\n" not in join.json()["error"], out
    # AND nothing was ever written under the job's working directory
    assert watch.seen == set(), out
    # AND the training process holds no more than 100 MB more than before
    assert after_rss - before_rss < 100, f"RSS {before_rss:.0f} -> {after_rss:.0f} MB{out}"
    # AND it kept training
    assert proc.poll() is None and after_step > before_step, out
