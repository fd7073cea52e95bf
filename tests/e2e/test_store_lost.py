"""Faults (issue 7): the job's c10d store is unreachable. Rank discovery says why ranks are
missing, in one line, and training goes on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.procs import kill_all, probe, spawn
from tests.support import python_env, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

STORE_MASTER = """
import sys, time
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=60))
print(store.port, flush=True)
time.sleep(600)
"""


def _status(d: Path, rank: int) -> dict:
    try:
        return json.loads((d / f"rank{rank}.json").read_text())
    except (OSError, ValueError):
        return {}


def test_unreachable_c10d_store_is_explained_and_training_continues(tmp_path: Path):
    # GIVEN a two-rank gloo job training, its TCPStore hosted by a process of its own
    master = subprocess.Popen([sys.executable, "-c", STORE_MASTER], env=python_env(),
                              stdout=subprocess.PIPE, text=True)
    ranks = []
    try:
        port = int(master.stdout.readline())
        status, agent_file, run = tmp_path / "status", tmp_path / "start-agent", tmp_path / "run"
        status.mkdir()
        for r in (0, 1):
            ranks.append(spawn("store_lost.py", ["--store-port", str(port), "--status-dir",
                                                 str(status), "--agent-file", str(agent_file)],
                               run, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r)))
        wait_until(lambda: all(_status(status, r).get("step", 0) >= 5 for r in (0, 1)), 90,
                   "the ranks never trained")
        # WHEN the store dies, and only then do the agents start (their registries find it gone)
        master.kill()
        master.wait()
        agent_file.touch()
        url = wait_until(lambda: _status(status, 0).get("url"), 60, "rank 0's agent never started")

        def failing() -> dict | None:
            body = httpx.get(f"{url}/v1/ranks", timeout=5).json()
            return body if body["discovery"]["state"] == "failing" else None

        body = wait_until(failing, 30, "rank 0 never reported the store as unreachable")
        # THEN the agent answers for itself and says why the others are missing
        assert [e["rank"] for e in body["ranks"]] == [0] and body["world_size"] == 2
        assert f"127.0.0.1:{port}" in body["discovery"]["error"]
        # AND the CLI on this machine still reaches both ranks: rank 1, up but missing from the
        # rank list, is found through the run dirs (transport/unjoined.py), so the answer is
        # whole, not partial
        out = probe("-t", url, "--json", "info", run_dir=run)
        assert out.returncode == 0, out.stderr
        assert sorted(r["rank"] for r in json.loads(out.stdout)) == [0, 1], out.stdout
        # AND both ranks keep training
        before = [_status(status, r)["step"] for r in (0, 1)]
        wait_until(lambda: all(_status(status, r)["step"] > before[r] + 20 for r in (0, 1)), 30,
                   "training stalled after the store died")
        assert all(p.poll() is None for p in ranks)
    finally:
        master.kill()
        master.wait()
        master.stdout.close()
        for p in ranks:
            kill_all(p, tmp_path / "run")
