"""No watchdog outlives its job: a watchdog stopped on purpose (SIGTERM, as a job tearing down
its process tree sends; Lightning then keeps the rank alive a while) is not restarted, and a
dead rank's watchdog ends its grace once the rank's launcher is gone too.

Before: the agent restarted the SIGTERMed watchdog, and that one then served the dead rank for
the whole PROBE_WATCHDOG_GRACE_S (600 s) after the job had ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.procs import kill_all, spawn, wait_json
from tests.e2e.test_backtrace_every_state import _alive, _watchdog_pid
from tests.support import PROGRAMS, python_env, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

#: Runs its arguments as the rank, then waits for its stdin to close before exiting.
LAUNCHER = ("import subprocess, sys\nrc = subprocess.call(sys.argv[1:])\nsys.stdin.read()\n"
            "sys.exit(rc)")


def test_a_sigtermed_watchdog_is_not_restarted(tmp_path: Path):
    run = tmp_path / "run"
    ready = tmp_path / "ready.json"
    proc = spawn("watchdog_train.py", ["--ready-file", str(ready)], run,
                 PROBE_WATCHDOG="1", PROBE_WATCHDOG_GRACE_S="600")
    try:
        info = wait_json(ready, proc, timeout=60)
        old = _watchdog_pid(run, info["pid"])
        assert old is not None
        # WHEN the watchdog gets SIGTERM (the job tearing its processes down)
        os.kill(old, signal.SIGTERM)

        # THEN the agent serves its sockets itself: the watchdog is not restarted
        def fallback() -> dict | None:
            try:
                wd = httpx.get(f"{info['url']}/v1/info", timeout=5).json()["watchdog"]
            except (httpx.HTTPError, KeyError, ValueError):
                return None
            return wd if wd.get("in_process_fallback") else None

        wd = wait_until(fallback, 30, "the agent never served its sockets after the SIGTERM")
        assert wd["restarts"] == 0 and wd["last_death"] == "exited with status 0", wd
        assert not _alive(old)
        assert _watchdog_pid(run, info["pid"]) in (None, old)  # no new watchdog recorded
        r = httpx.get(f"{info['url']}/v1/backtrace", timeout=10)
        assert r.status_code == 200 and "train_forever" in r.text
    finally:
        kill_all(proc, run)


def test_a_dead_ranks_watchdog_ends_when_its_launcher_is_gone(tmp_path: Path):
    run = tmp_path / "run"
    ready = tmp_path / "ready.json"
    # GIVEN a rank started by a launcher process (its parent), with a 600 s grace; the
    # launcher outlives its rank until its stdin closes (torchrun tears the other ranks down
    # before it exits)
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, sys.executable, str(PROGRAMS / "watchdog_train.py"),
         "--ready-file", str(ready)],
        env=python_env(PROBE_PORT="0", PROBE_RUN_DIR=str(run), PROBE_WATCHDOG="1",
                       PROBE_WATCHDOG_GRACE_S="600"),
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        info = wait_json(ready, launcher, timeout=60)
        wd = _watchdog_pid(run, info["pid"])
        assert wd is not None
        # WHEN the rank is killed: its watchdog reports it while the launcher lives
        os.kill(info["pid"], signal.SIGKILL)

        def dead() -> bool:
            try:
                return httpx.get(f"{info['url']}/v1/health", timeout=5).status_code == 410
            except httpx.HTTPError:
                return False

        wait_until(dead, 30, "the watchdog never reported the rank dead")
        assert _alive(wd)
        # AND the launcher exits too (the job is over)
        launcher.stdin.close()
        launcher.wait(30)
        gone_at = time.monotonic()
        # THEN the watchdog ends within seconds, not after its 600 s grace
        wait_until(lambda: not _alive(wd), 10, "the watchdog outlived the job")
        assert time.monotonic() - gone_at < 10
    finally:
        kill_all(launcher, run)
