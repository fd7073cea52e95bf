"""PROBE=1 starts the agent before the program imports torch; tracing arms itself right after
`import torch` without importing it earlier (issue 3)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import PROGRAMS, python_env

pytest.importorskip("torch")
pytest.importorskip("duckdb")


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_agent_started_before_torch_traces_after_the_import(tmp_path, hot_path):
    # hot_path "native": the C++ hot path is built and cached on this machine (conftest)
    native = "auto" if hot_path == "native" else "off"
    out = tmp_path / "out.json"
    env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(tmp_path / "run"),
                     PROBE_WATCHDOG="0", PROBE_TRACE="on", PROBE_TRACE_NATIVE=native)
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / "trace_train.py"), "--out", str(out), "--steps", "4",
         "--pause", "2" if native == "auto" else "0"],
        env=env, capture_output=True, text=True, timeout=200,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(out.read_text())
    assert got["agent"], proc.stderr
    assert got["torch_before"] is False  # the agent did not import torch
    by = {(s, stage): n for s, stage, n in got["trace"]}
    assert {s for s, _ in by} == {1, 2, 3, 4}
    assert by[(4, "forward")] == 4 and by[(4, "backward")] == 4 and by[(4, "step")] == 1
    assert got["modules"] == [["0"], ["1"], ["2"], ["AdamW"], ["Sequential"]]
    assert got["steps"] == [[4]] and got["metrics"] == [[4]]
    assert got["state"]["failures"] == 0
    # AND with PROBE_TRACE_NATIVE=auto the cached C++ hot path loaded (and traced) by itself
    assert got["state"]["hot_path"] == ("native" if native == "auto" else "python"), got["state"]
