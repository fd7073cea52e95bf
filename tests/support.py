"""Helpers shared by tests: bounded waits, child-process environments, paths."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

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
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
