"""Helpers shared by tests: bounded waits, child-process environments, paths."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "tests" / "programs"


def wait_until(predicate: Callable[[], object], timeout: float, message: str) -> object:
    """Poll ``predicate`` until it returns something truthy; fail with ``message`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s: {message}")
        time.sleep(0.02)


def agent_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("probe-agent")]


def python_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: this interpreter's packages plus the repo."""
    # no agent settings leak in, except where the C++ hot path is cached (a machine setting)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PROBE") or k == "PROBE_NATIVE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    # the Python hot path unless a test asks for the C++ one (whose background build would
    # otherwise switch paths between tests)
    env["PROBE_TRACE_NATIVE"] = "off"
    env.update(extra)
    return env


def run_script_result(script: str, *args: str, timeout: float) -> dict[str, Any]:
    """Run ``script`` in a fresh interpreter (``python -c``) and return the JSON it printed on
    its ``RESULT `` line: for checks that need a process of their own (a process group, a
    torch mode). A non-zero exit fails with the child's output."""
    done = subprocess.run([sys.executable, "-c", script, *args], env=python_env(),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (read from /proc), children before grandchildren."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants. A process group is not enough: torchrun starts
    each worker in a session of its own, and a SIGKILLed launcher cannot reap them."""
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def ddl_schemas() -> dict[str, object]:
    """Every table of sql/schema.sql as the Arrow schema DuckDB gives it (``pa.Schema``), by
    qualified name: what collectors must build their batches with."""
    import duckdb

    from probe_agent.store.catalog import load_schema

    con = duckdb.connect()
    try:
        con.execute(load_schema())
        tables = [t for (t,) in con.execute(
            "SELECT schema_name || '.' || table_name FROM duckdb_tables()").fetchall()]
        return {t: con.sql(f"SELECT * FROM {t} LIMIT 0").to_arrow_table().schema for t in tables}
    finally:
        con.close()
