"""The FSDP2 numerics agreement (one all_reduce per step, collectors/sharded.py) never makes a
hang of its own: with the agent on one rank of two, the ranks never agree to it and the job
runs to its end; with the agent on both, one started later, they agree from one step on, and
when that rank's agent stops mid-run both stop agreeing at the same step and the job runs to
its end."""

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
    # says it announced itself and is still waiting for the others to (never in a wait: the
    # first version blocked that step 10 s)
    assert set(got) == {0}, got
    sharded = got[0]["sharded"]
    assert got[0]["on"] is False and sharded["on"] is False, got
    assert sharded["announced"] is not None and sharded["start"] is None, got


def test_a_rank_whose_agent_starts_later_agrees_with_the_others_then_leaves(tmp_path):
    # GIVEN the agent on both ranks, rank 1's started only after step 3 (its optimizer hook
    # in place steps after rank 0's: a loaded writer tick, `probe inject`), and stopped at 12
    got = _run(tmp_path, "--agent-ranks", "0,1", "--agent-from", "3", "--steps", "20",
               "--stop-agent-at", "12")
    # THEN both agreed from one step on (the first version's store barrier timed out at rank
    # 0's first step, with rank 1 waiting in FSDP2's next all-gather: off for the whole run),
    s0, s1 = got[0]["sharded"], got[1]["sharded"]
    assert got[0]["on"] is True and got[1]["on"] is True, got
    assert s0["start"] == s1["start"] and 4 < s0["start"] < 12, got
    # each step's norm the whole model's: the same number on both ranks (a shard's differs)
    step = str(s0["start"] + 1)
    assert got[0]["norms"][step] == got[1]["norms"][step] is not None, got
    # AND both ran to the end, and stopped agreeing when rank 1 left
    assert s0["on"] is False and s0["off"] == "a rank's numerics recorder stopped", got
