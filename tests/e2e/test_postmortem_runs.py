"""Two runs torchrun did not name, on the same MASTER_ADDR:MASTER_PORT, one after the other from
the same parent: each gets a copy of its own. The second's clean exit must not remove the first
one's crash, and the first's exception must not be reported as the second's."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import PROGRAMS, python_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def _run(tmp: Path, port: int, mode: str) -> subprocess.CompletedProcess[str]:
    root = tmp / "run" / "postmortem"
    env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(tmp / "run"),
                     PROBE_WATCHDOG="0", PROBE_POSTMORTEM_EVERY_S="0.2",
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0",
                     WORLD_SIZE="1", TORCHELASTIC_RUN_ID="none")
    return subprocess.run([sys.executable, str(PROGRAMS / "postmortem_rerun.py"), "--mode", mode,
                           "--root", str(root)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=str(tmp))


def test_runs_on_one_port_keep_their_own_copies(tmp_path: Path):
    (tmp_path / "run").mkdir(mode=0o700)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    first = _run(tmp_path, port, "raise")
    assert first.returncode == 1, first.stderr[-2000:]
    second = _run(tmp_path, port, "clean")
    assert second.returncode == 0, second.stderr[-2000:]

    root = tmp_path / "run" / "postmortem"
    jobs = sorted(p for p in root.iterdir() if p.is_dir())
    assert len(jobs) == 1, jobs  # the first run's crash; the clean second run left nothing
    assert jobs[0].name.startswith(f"127.0.0.1-{port}-"), jobs
    end = json.loads((jobs[0] / "rank-0" / "end.json").read_text())
    assert end["kind"] == "exception" and "went bad in the first run" in end["exception"]
    assert not list(jobs[0].glob("rank-0/*.tmp")) and not list(jobs[0].glob("rank-0/.*.tmp"))
