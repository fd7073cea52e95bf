"""Crash forensics: a dead rank's watchdog reports how it died, its last stack and step."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from probe_protocol.bodies import BacktraceBody
from probe_protocol.envelope import ErrorBody
from tests.e2e.procs import kill_all, probe, spawn, wait_json
from tests.support import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture
def train_rank(tmp_path: Path):
    procs = []

    def start(*args: str):
        ready = tmp_path / "ready.json"
        proc = spawn("watchdog_train.py", ["--ready-file", str(ready), *args], tmp_path / "run",
                     PROBE_WATCHDOG="1", PROBE_WATCHDOG_SNAPSHOT_S="0.3",
                     PROBE_WATCHDOG_GRACE_S="30")
        procs.append(proc)
        return proc, wait_json(ready, proc, timeout=90)

    yield start
    for proc in procs:
        kill_all(proc, tmp_path / "run")


def _dead_health(url: str) -> dict:
    def dead() -> dict | None:
        r = httpx.get(f"{url}/v1/health", timeout=5)
        return r.json() if r.status_code == 410 else None

    return wait_until(dead, 45, "the watchdog never reported the rank dead")


def test_sigkill_is_reported_with_last_backtrace_and_step(train_rank, capsys):
    # GIVEN a training rank 40 steps in
    proc, info = train_rank("--ready-step", "40")
    # WHEN it is SIGKILLed (nothing runs inside it; its parent has not reaped it yet)
    os.kill(info["pid"], signal.SIGKILL)
    # THEN its watchdog still answers, with the signal, the last step and the last stack
    health = _dead_health(info["url"])
    assert health["state"] == "dead" and health["status"] == 410
    assert health["exit"]["signal"] == 9 and health["exit"]["signal_name"] == "SIGKILL"
    assert health["last_step"] >= 40
    assert "killed by signal 9 (SIGKILL)" in health["error"]
    bt = httpx.get(f"{info['url']}/v1/backtrace", timeout=5).json()
    assert bt["ok"] and bt["state"] == "dead" and bt["exit"]["signal"] == 9
    main = next(t for t in bt["threads"] if t["is_main"])
    assert "train_forever" in [f["func"] for f in main["frames"]]
    assert bt["last_backtrace"]["threads"]
    # AND the watchdog's bodies are the protocol's, key for key (the dead rank's facts)
    assert BacktraceBody.from_wire(bt).to_wire() == bt
    assert ErrorBody.from_wire(health).to_wire() == health
    # AND `probe backtrace` shows the rank as dead, with its cause
    from probe_cli.main import main as probe_main

    capsys.readouterr()
    assert probe_main(["-t", info["url"].removeprefix("http://"), "backtrace"]) == 0
    out = capsys.readouterr().out
    assert "DEAD: killed by signal 9 (SIGKILL)" in out and "train_forever" in out


def test_uncaught_exception_is_reported_with_its_traceback(train_rank, tmp_path):
    # GIVEN a rank that raises at step 30
    proc, info = train_rank("--ready-step", "5", "--raise-at-step", "30")
    # WHEN it dies of it, THEN the exit carries the exception and the raise site
    health = _dead_health(info["url"])
    assert health["exit"]["code"] == 1, health["exit"]
    assert "RuntimeError: loss exploded at step 30" in health["exit"]["exception"]
    frames = health["last_backtrace"]["threads"][0]["frames"]
    assert frames[0]["func"] == "train_forever"
    assert health["last_backtrace"]["route"] == "uncaught exception traceback"
    # AND `probe ps` lists it as dead
    ps = probe("ps", run_dir=tmp_path / "run")
    assert f"{info['pid']}" in ps.stdout and "dead: exited with code 1" in ps.stdout, ps
    # AND the program's own output ends with its traceback: no noise of ours at exit (the
    # watchdog's waiter thread outlives exit, and once kept DuckDB alive: nanobind "leaked")
    out = proc.stdout.read()
    assert "RuntimeError: loss exploded at step 30" in out
    assert "leaked" not in out and "nanobind" not in out, out[-2000:]
