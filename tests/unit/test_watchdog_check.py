"""The agent's check that its living watchdog serves (probe_agent/serving/watchdog_check.py),
against real processes and a real unix socket: one that answers, one that never does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from probe_agent.serving import watchdog_check
from probe_agent.serving.watchdog_check import WatchdogCheck, proc_state
from tests.support import wait_until


def _ticks(check: WatchdogCheck, seconds: float) -> str | None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        why = check.tick()
        if why is not None:
            return why
        time.sleep(0.02)
    return None


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_stopped_process_is_reported_after_the_grace(sleeper, monkeypatch):
    monkeypatch.setattr(watchdog_check, "STOPPED_S", 0.3)
    check = WatchdogCheck(sleeper.pid, None)
    assert _ticks(check, 0.5) is None  # running (sleeping): nothing to say
    os.kill(sleeper.pid, signal.SIGSTOP)
    wait_until(lambda: proc_state(sleeper.pid) == "T", 5, "never stopped")
    why = _ticks(check, 5)
    assert why is not None and why.startswith("stopped (SIGSTOP"), why


def test_a_watchdog_that_never_answers_is_hung_and_one_that_answers_is_not(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setattr(watchdog_check, "PROBE_EVERY_S", 0.0)
    monkeypatch.setattr(watchdog_check, "HUNG_S", 0.5)
    mute, talks = str(tmp_path / "mute.sock"), str(tmp_path / "talks.sock")
    silent = socket.socket(socket.AF_UNIX)
    silent.bind(mute)
    silent.listen(8)  # accepts into its backlog, never answers: a stuck event loop
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(talks)
    srv.listen(8)
    stop = threading.Event()

    def answer() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn = srv.accept()[0]
            except OSError:
                continue
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
            conn.close()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    good, bad = WatchdogCheck(os.getpid(), talks), WatchdogCheck(os.getpid(), mute)
    try:
        assert _ticks(good, 1.5) is None
        why = _ticks(bad, 3)
        assert why is not None and "(hung)" in why, why
    finally:
        good.close()
        bad.close()
        stop.set()
        t.join(2)
        silent.close()
        srv.close()
