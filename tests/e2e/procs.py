"""Helpers for the watchdog and inject e2e tests: real processes, bounded waits, clean teardown.

Every process is started in its own session and killed as a process group at teardown; the
watchdogs (their own session, by design) are found through ``<pid>.watchdog.json`` and killed
too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import PROGRAMS, ROOT, kill_tree, python_env, wait_until

SPIN_C = r"""
#include <time.h>
/* Busy for `seconds` without releasing the GIL (called through ctypes.PyDLL). */
double spin(double seconds) {
    struct timespec t0, t;
    double x = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        for (int i = 0; i < 100000; i++) x += i * 1e-9;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9 < seconds);
    return x;
}
"""


def spin_library(tmp: Path) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler (cc) to build the GIL-holding test library")
    src, lib = tmp / "spin.c", tmp / "libspin.so"
    src.write_text(SPIN_C)
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return str(lib)


def require_pyspy() -> None:
    sys.path.insert(0, str(ROOT))
    from probe_agent.profiling.pyspy import find_pyspy

    if find_pyspy() is None:
        pytest.skip("py-spy is not installed (pip install 'probe-torch[agent]')")


def require_ptrace() -> None:
    """Skip unless this process may ptrace a child of its own uid (Yama, containers)."""
    from probe_cli.injection import ptrace

    child = subprocess.Popen(["sleep", "5"])
    try:
        t = ptrace.Tracee(child.pid, child.pid)
        t.seize()
        t.detach()
    except OSError as e:
        pytest.skip(f"ptrace is not permitted here ({e}); in a container add --cap-add=SYS_PTRACE")
    finally:
        child.kill()
        child.wait()


def spawn(program: str, args: list[str], run_dir: Path, **env: str) -> subprocess.Popen[str]:
    child_env = python_env(PROBE_PORT="0", PROBE_RUN_DIR=str(run_dir), **env)
    return subprocess.Popen([sys.executable, str(PROGRAMS / program), *args], env=child_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def wait_json(path: Path, proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"program exited early ({proc.returncode}):\n{proc.stdout.read()}")
        return path.exists()

    wait_until(ready, timeout, f"{path.name} never appeared")
    return json.loads(path.read_text())


def kill_all(proc: subprocess.Popen[str], run_dir: Path) -> None:
    """Kill the program's process group, then every watchdog recorded in ``run_dir``."""
    try:
        kill_tree(proc.pid)
    except ProcessLookupError:
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass
    if proc.stdout is not None:
        proc.stdout.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        records = list(run_dir.glob("*.watchdog.json")) if run_dir.exists() else []
        if not records:
            break
        for rec in records:
            try:
                os.kill(int(json.loads(rec.read_text())["watchdog_pid"]), signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass
            rec.unlink(missing_ok=True)
        time.sleep(0.05)


def probe(*args: str, run_dir: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess (pins real exit codes and output)."""
    return subprocess.run([sys.executable, "-m", "probe_cli", "--run-dir", str(run_dir), *args],
                          env=python_env(), capture_output=True, text=True, timeout=timeout)
