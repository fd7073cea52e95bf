"""`probe inject PID`: attach to Python processes started without probe (issue 5).

Real processes and the real ptrace injector; skipped, with the reason, where ptrace is refused.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.e2e.procs import kill_all, probe, require_ptrace, spawn, spin_library, wait_json
from tests.support import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture
def plain_train(tmp_path: Path):
    """``start(*args)`` -> (pid, stats path): plain_train.py with no agent and no PROBE vars."""
    require_ptrace()
    procs = []

    def start(*args: str):
        stats = tmp_path / "stats.json"
        proc = spawn("plain_train.py", ["--stats-file", str(stats), *args], tmp_path / "run")
        procs.append(proc)
        return wait_json(stats, proc)["pid"], stats, proc

    yield start
    for proc in procs:
        kill_all(proc, tmp_path / "run")


def _stats(path: Path) -> dict:
    return json.loads(path.read_text())


def _threads(pid: int) -> set[str]:
    """The target's OS threads (task ids)."""
    return set(os.listdir(f"/proc/{pid}/task"))


def test_inject_then_query_eval_backtrace(plain_train, tmp_path):
    # GIVEN a training loop started without probe
    pid, stats, _ = plain_train()
    run = tmp_path / "run"
    # WHEN we inject
    r = probe("--json", "inject", str(pid), "--port", "0", run_dir=run)
    # THEN the agent runs, as if started at launch
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert body["state"] == "started" and body["route"] == "ptrace", body
    assert body["url"].startswith("http://127.0.0.1:")
    q = probe(str(pid), "--json", "query", "SELECT 40 + 2 AS answer", run_dir=run)
    assert q.returncode == 0 and json.loads(q.stdout)[0]["rows"] == [[42]], q.stderr
    e = probe(str(pid), "--json", "eval", "steps > 0", run_dir=run)
    assert e.returncode == 0 and json.loads(e.stdout)[0]["result"] == "True", e.stderr + e.stdout
    b = probe(str(pid), "--json", "backtrace", run_dir=run)
    main = next(t for t in json.loads(b.stdout)[0]["threads"] if t["is_main"])
    assert "main" in [f["func"] for f in main["frames"]]
    # AND injecting twice is detected
    again = probe("inject", str(pid), "--port", "0", run_dir=run)
    assert again.returncode == 1 and "already has a probe agent" in again.stderr
    # AND the target trained on, its numerics intact
    assert _stats(stats)["bad"] == 0


def test_inject_into_gil_holding_target_times_out_cleanly(plain_train, tmp_path):
    # GIVEN a target whose main thread holds the GIL in a C call for 6 s
    go = tmp_path / "go"
    pid, stats, proc = plain_train("--lib", spin_library(tmp_path), "--go-file", str(go),
                                   "--spin-s", "6")
    go.touch()
    wait_until(lambda: not go.exists(), 20, "the target never started its C call")
    before = _stats(stats)["steps"]
    threads_before = _threads(pid)
    # WHEN we inject with a short wait
    t0 = time.monotonic()
    r = probe("inject", str(pid), "--port", "0", "--wait", "1.5", run_dir=tmp_path / "run")
    # THEN it gives up cleanly, saying why, without leaving the target stopped
    assert r.returncode == 1, r.stdout + r.stderr
    assert "GIL is held" in r.stderr and "runs on" in r.stderr
    assert time.monotonic() - t0 < 30
    # AND the target continues once its C call returns, and no agent starts late
    wait_until(lambda: _stats(stats)["steps"] > before, 30, "the target did not continue")
    assert proc.poll() is None
    # The bootstrap runs on the thread the injector started, once that thread gets the GIL; it
    # writes its status before anything else, then the thread ends. So once the target has no
    # thread it did not have before (the ptrace route; sys.remote_exec runs it on the main
    # thread before the step counted above), the bootstrap has run: nothing it wrote means it
    # did nothing (issue 18: a real signal, not a sleep).
    wait_until(lambda: _threads(pid) <= threads_before, 30,
               "the injected thread is still alive: the bootstrap has not run")
    assert not (tmp_path / "run" / f"{pid}.sock").exists()
    status = tmp_path / "run" / f"{pid}.inject.json"
    assert not status.exists(), status.read_text()


def test_repeated_injection_keeps_numerics(plain_train, tmp_path):
    """inject -> query -> stop, 20 times, into a target that checks its own float results."""
    from probe_cli.main import main as probe_main
    from probe_cli.transport.local_socket import agent_answers

    pid, stats, proc = plain_train("--step-sleep", "0")
    run = tmp_path / "run"
    sock = str(run / f"{pid}.sock")
    n = int(os.environ.get("PROBE_TEST_INJECTIONS", "20"))
    for i in range(n):
        assert proc.poll() is None, f"target died before injection {i}:\n{proc.stdout.read()}"
        # WHEN we inject (no watchdog: this is about the injector) and use the agent
        assert probe_main(["--run-dir", str(run), "inject", str(pid), "--port", "0",
                           "--no-watchdog"]) == 0, f"injection {i}"
        assert agent_answers(sock)
        # THEN stop it from inside, and wait until it is gone
        import httpx

        with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://x",
                          timeout=10) as c:
            r = c.post("/v1/eval", json={"code": "import threading, probe_agent; "
                                                 "threading.Timer(0.05, probe_agent.stop).start()"})
            assert r.status_code == 200 and r.json()["ok"], r.text
        # stop() removes the socket file last: then the agent is wholly gone
        wait_until(lambda: not os.path.exists(sock), 20, f"agent {i} did not stop")
    # THEN the target is alive and never computed a wrong number
    assert proc.poll() is None
    final = _stats(stats)
    assert final["bad"] == 0 and final["steps"] > n, final
