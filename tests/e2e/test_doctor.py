"""`probe doctor` on real programs for the findings the troubleshooting guide does not cover
(tests/e2e/test_troubleshooting.py covers hang, stall, NaN/Inf, memory growth, DataLoader wait,
clipping and LR, and a healthy job): a straggler with its collective wait, and the slowest
module. Commands are retried until the finding shows (it needs a few steps), bounded."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.e2e.training import probe, training_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def doctor_until(args: list[str], env: dict[str, str], done, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while True:
        out = probe(*args, "--json", "doctor", env=env)
        body = json.loads(out.stdout) if out.stdout.strip().startswith("{") else {}
        if done(out, body) or time.monotonic() > deadline:
            return out, body
        time.sleep(1.0)


def _checks(body: dict) -> dict[str, dict]:
    return {f["check"]: f for f in body.get("findings", [])}


def test_doctor_names_the_straggler_and_the_time_the_others_wait(tmp_path: Path):
    # GIVEN 2 DDP ranks where rank 1 sleeps 100 ms before every step
    with training_job(tmp_path, "straggler_sleep.py", ("--sleep", "0.1"), nproc=2) as (_, infos):
        target = ["-t", infos[0]["url"].removeprefix("http://")]
        # WHEN doctor runs
        out, body = doctor_until(target, {}, lambda o, b: {"straggler", "collectives"}
                                 <= set(_checks(b)))
    # THEN the straggler is rank 1, the fast rank waits in collectives, exit code 4
    found = _checks(body)
    assert out.returncode == 4, out.stdout + out.stderr
    assert found["straggler"]["ranks"] == [1], found
    assert found["straggler"]["next"] == "probe straggler"
    assert 0 in found["collectives"]["ranks"], found
    assert body["problem"] is True


def test_doctor_lists_the_slow_module_first(tmp_path: Path):
    # GIVEN a model whose middle layer sleeps 300 ms (well above the noise of 2 busy cores),
    # traced every step
    with training_job(tmp_path, "slow_module.py", ("--sleep", "0.3", "--ready-after", "3"),
                      env={"PROBE_TRACE": "on"}) as (_, infos):
        pid = str(infos[0]["pid"])
        env = {"PROBE_RUN_DIR": str(tmp_path / "run")}
        # WHEN doctor runs
        out, body = doctor_until([pid], env, lambda o, b: "modules" in _checks(b))
    # THEN "slow" heads the slowest modules, as information (not a problem on its own)
    modules = _checks(body)["modules"]
    assert modules["severity"] == "info"
    assert modules["title"] == "slowest modules: slow first", modules
    assert modules["evidence"][0].startswith("slow: "), modules


def test_doctor_says_when_ranks_never_communicate(tmp_path: Path):
    # GIVEN 2 ranks of one torchrun job that never all-reduce (a model not wrapped in DDP)
    with training_job(tmp_path, "toy_train.py", ("--no-sync", "--step-sleep", "0.005"),
                      nproc=2) as (_, infos):
        target = ["-t", infos[0]["url"].removeprefix("http://")]
        # WHEN doctor runs once they have stepped enough to judge
        out, body = doctor_until(target, {}, lambda o, b: "isolated" in _checks(b))
        # AND `probe throughput` does not count them as data-parallel ranks (GB_tok)
        tput = probe(*target, "--json", "throughput")
    jobs = [r["job"] for r in json.loads(tput.stdout)]
    assert jobs and all(j["dp_world"] == 1 for j in jobs), tput.stdout
    assert jobs[0]["dp_source"].startswith("not data-parallel: the 2 ranks never communicate")
    # THEN it says so, naming both ranks, as a warning (exit 4)
    found = _checks(body).get("isolated")
    assert found is not None, out.stdout + out.stderr
    assert found["ranks"] == [0, 1] and found["severity"] == "warning"
    assert found["title"].startswith("RANKS NEVER COMMUNICATE: 2 ranks, 0 collectives in ")
    assert out.returncode == 4
