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


def _digest(run_dir: Path | None) -> tuple[str, bool]:
    env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(run_dir)) if run_dir \
        else python_env()
    out = subprocess.run([sys.executable, str(PROGRAMS / "seeded_job.py"), "--steps", "24"],
                         env=env, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stdout + out.stderr
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("DIGEST ")][-1]
    _, digest, _, peak = line.split()
    return digest, peak == "True"


def test_seeded_draws_are_the_same_with_and_without_the_agent(tmp_path):
    # GIVEN a seeded job's draws without the agent
    plain, _ = _digest(None)
    run_dir = tmp_path / "run"
    # WHEN it runs under the agent in a fresh run dir (the CPU peak is measured mid-run), then
    # again with the peak cached from the first run
    measured, peak_written = _digest(run_dir)
    cached, _ = _digest(run_dir)
    # THEN the measurement did happen, and every arm drew the same numbers
    assert peak_written, "the agent never measured the CPU peak: the test proves nothing"
    assert measured == plain
    assert cached == plain
