"""The agent never moves a seeded job's random numbers: the same seed draws the same inputs,
dropout masks, ``random`` and numpy values with and without ``PROBE=1``, whether the agent
measures the node's CPU peak during the run (a fresh run dir) or finds it cached."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import PROGRAMS, python_env

pytestmark = pytest.mark.e2e


def _start(run_dir: Path | None) -> subprocess.Popen:
    env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(run_dir)) if run_dir \
        else python_env()
    return subprocess.Popen([sys.executable, str(PROGRAMS / "seeded_job.py"), "--steps", "24"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _digest(proc: subprocess.Popen) -> tuple[str, bool]:
    try:
        out, _ = proc.communicate(timeout=150)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    line = [ln for ln in out.splitlines() if ln.startswith("DIGEST ")][-1]
    _, digest, _, peak = line.split()
    return digest, peak == "True"


@pytest.mark.timeout(360)
def test_seeded_draws_are_the_same_with_and_without_the_agent(tmp_path):
    run_dir = tmp_path / "run"
    # GIVEN a seeded job's draws without the agent, and WHEN it runs under the agent in a fresh
    # run dir (the CPU peak is measured mid-run), side by side (suite time), then again with the
    # peak cached from the first run
    plain_job, measured_job = _start(None), _start(run_dir)
    plain, _ = _digest(plain_job)
    measured, peak_written = _digest(measured_job)
    cached, _ = _digest(_start(run_dir))
    # THEN the measurement did happen, and every arm drew the same numbers
    assert peak_written, "the agent never measured the CPU peak: the test proves nothing"
    assert measured == plain
    assert cached == plain
