"""The FSDP2 numerics agreement (one all_reduce per step, collectors/sharded.py) never makes a
hang of its own: with the agent on one rank of two, the ranks never agree to it and the job
runs to its end; with the agent on both and one rank's agent stopped mid-run, both stop
agreeing at the same step and the job runs to its end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import PROGRAMS, kill_tree, python_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _run(tmp_path, *args: str) -> dict[int, dict]:
    env = python_env(PROBE_RUN_DIR=str(tmp_path / "run"), PROBE_WATCHDOG="0")
    env.pop("PROBE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
         "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
         str(PROGRAMS / "fsdp2_partial_agent.py"), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=240)  # a hang of the agent's making ends here
    finally:
        kill_tree(proc.pid)  # the ranks too, when torchrun is stuck
        proc.wait(10)
    assert proc.returncode == 0, text[-4000:]
    got = {}
    decoder = json.JSONDecoder()
    for part in text.split("PARTIAL ")[1:]:  # two ranks' lines may share one line of output
        body, _ = decoder.raw_decode(part)
        got[body["rank"]] = body
    return got


def test_an_agent_on_one_rank_adds_no_collective(tmp_path):
    # GIVEN a 2-rank FSDP2 job with the agent on rank 0 only
    got = _run(tmp_path, "--agent-ranks", "0", "--steps", "20")
    # THEN it ran its 20 steps (no collective of the agent's waited for rank 1), and rank 0
    # says why it does not agree
    assert set(got) == {0}, got
    assert got[0]["on"] is False and got[0]["sharded"] is False, got
    assert "reached step" in got[0]["off"], got


def test_a_rank_that_stops_its_agent_leaves_the_agreement_with_the_others(tmp_path):
    # GIVEN the agent on both ranks, agreeing each step, and rank 1's agent stopped at step 8
    got = _run(tmp_path, "--agent-ranks", "0,1", "--steps", "20", "--stop-agent-at", "8")
    # THEN both ran to the end: rank 0 agreed, then stopped agreeing when rank 1 left
    assert got[0]["on"] is True and got[0]["sharded"] is False, got
    assert got[0]["off"] == "a rank's numerics recorder stopped", got
