"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.procs import kill_all, spawn, spin_library, wait_json


@pytest.fixture
def gil_rank(tmp_path: Path):
    """``start(reader, spin_s, train, workers, **env)`` -> (info, go_file, done_file); killed
    (with its watchdog) at teardown. ``train``: SGD steps while waiting (step-boundary actions);
    ``workers``: that many DataLoader worker processes, idle (children to read).
    ``env``: more PROBE_* variables for the rank."""
    procs = []

    def start(reader: str = "auto", spin_s: float = 4.0, train: bool = False, workers: int = 0,
              **env: str):
        lib = spin_library(tmp_path)
        ready, go, done = tmp_path / "ready.json", tmp_path / "go", tmp_path / "done"
        proc = spawn("gil_holder.py", ["--lib", lib, "--ready-file", str(ready), "--go-file",
                                       str(go), "--done-file", str(done), "--spin-s", str(spin_s),
                                       *(["--train"] if train else []),
                                       *(["--workers", str(workers)] if workers else [])],
                     tmp_path / "run", PROBE_WATCHDOG="1", PROBE_WATCHDOG_READER=reader,
                     PROBE_WATCHDOG_GRACE_S="5", **env)
        procs.append(proc)
        return wait_json(ready, proc), go, done

    yield start
    for proc in procs:
        kill_all(proc, tmp_path / "run")
