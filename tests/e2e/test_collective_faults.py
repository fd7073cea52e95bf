"""Collective faults on real 2-rank gloo jobs (tests/programs/collective_job.py), read after
the job died: a collective only rank 0 calls (gloo aborts rank 0 on the size it receives), and a
rank that stalls until the process group's timeout, inside DDP's gradient all-reduce.

The jobs run side by side in one module fixture and die on their own; every assertion reads
the post-mortem copies they left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.procs import kill_all
from tests.support import PROGRAMS, python_env, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def _start(tmp: Path, name: str, scenario: str, *args: str) -> dict:
    base = tmp / name
    (base / "ready").mkdir(parents=True)
    os.chmod(base, 0o700)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
           "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
           str(PROGRAMS / "collective_job.py"), "--scenario", scenario,
           "--ready-dir", str(base / "ready"), *args]
    env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(base / "run"),
                     PROBE_WATCHDOG="1", PROBE_WATCHDOG_GRACE_S="20")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, cwd=str(base))
    return {"proc": proc, "base": base, "root": base / "run" / "postmortem"}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("collective-faults")
    started = {"rank0_only": _start(tmp, "rank0", "rank0_only"),
               "stall": _start(tmp, "stall", "stall", "--timeout-s", "15")}
    # While rank 1 stalls (before the timeout kills the job): what a scheduler's poll sees.
    ready = started["stall"]["base"] / "ready"
    wait_until(lambda: all((ready / f"rank{r}.json").exists() for r in range(2)), 120,
               "the stall job's ranks never became ready")
    url = json.loads((ready / "rank0.json").read_text())["url"].removeprefix("http://")
    started["stall"]["health"] = wait_until(
        lambda: (h := probe("-t", url, "--json", "health", "--stall", "2", "--no-straggler",
                            "--exclude-file", str(tmp / "exclude"))).returncode == 4 and h,
        12, "probe health never said the stalled job was unhealthy")
    yield started
    for job in started.values():
        kill_all(job["proc"], job["base"] / "run")


def _dead_copy(job: dict) -> Path:
    try:
        job["proc"].wait(180)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the job did not end:\n{job['proc'].stdout.read()}") from None

    def one() -> Path | None:
        dirs = [p for p in job["root"].glob("*") if p.is_dir()] if job["root"].exists() else []
        if len(dirs) == 1 and all((dirs[0] / f"rank-{r}" / "death.json").exists()
                                  for r in range(2)):
            return dirs[0]
        return None

    return wait_until(one, 30, f"no post-mortem copy with both deaths under {job['root']}")


def probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "probe_cli", *args], env=python_env(),
                          capture_output=True, text=True, timeout=90)


def test_rank0_only_collective_is_named_from_the_copies_after_gloo_aborted_it(jobs):
    job_dir = _dead_copy(jobs["rank0_only"])
    # rank 0 left its call in the black box: pending when gloo aborted it
    strip = (job_dir / "rank-0" / "collectives.strip").read_bytes().rstrip(b"\0")
    assert b"log_metric" in strip
    hang = probe("-t", str(job_dir), "hang")
    assert hang.returncode == 4, hang.stdout + hang.stderr
    head = hang.stdout.splitlines()[0]
    assert head.startswith("COLLECTIVE MISMATCH (different sizes) at #"), hang.stdout
    assert "rank 0 called all_reduce with [1] at collective_job.py:" in head, head
    assert " log_metric where rank 1 called all_reduce with [577] at collective_job.py:" in head
    assert head.endswith("rank 0 is the odd one out"), head
    assert "rank 0 was aborted (SIGABRT) by the backend on this mismatch" in hang.stdout
    assert "copies taken: rank 0 " in hang.stdout
    # the JSON names both sides with their call sites
    body = json.loads(probe("-t", str(job_dir), "--json", "hang").stdout)
    m = body["mismatch"]
    assert m["kind"] == "sizes" and m["odd_ranks"] == [0] and body["culprits"] == [0]
    assert set(body["copies_taken_at"]) == {"0", "1"} and all(body["copies_taken_at"].values())
    sites = {tuple(s["ranks"]): s["callsite"] for s in m["sides"]}
    assert sites[(0,)].endswith("log_metric") and sites[(1,)].endswith(" main"), sites
    # doctor: the same culprit, and a summary line that counts it (exit 4)
    doc = probe("-t", str(job_dir), "doctor")
    assert doc.returncode == 4, doc.stdout + doc.stderr
    assert "no problem found" not in doc.stdout, doc.stdout
    assert "[critical] COLLECTIVE MISMATCH (different sizes)" in doc.stdout, doc.stdout


def test_health_says_hung_and_every_rank_writes_its_copy_at_once(jobs):
    health = jobs["stall"]["health"]
    body = json.loads(health.stdout)
    assert body["job"] == "hung", body
    # rank 1 sleeps; rank 0 waits for it in all_reduce (hung too once its own limit passes:
    # each watchdog measures its own rank's steps)
    assert [r["rank"] for r in body["ranks"]] == [0, 1] and body["ranks"][1]["state"] == "hung"
    assert "no optimizer step for" in body["ranks"][1]["reason"]
    assert body["copies_written"] == [0, 1] and body["exclude_hosts"] == []


def test_stall_until_the_timeout_names_the_rank_that_never_arrived(jobs):
    job = jobs["stall"]
    job_dir = _dead_copy(job)
    hang = probe("-t", str(job_dir), "hang")
    assert hang.returncode == 4, hang.stdout + hang.stderr
    head = hang.stdout.splitlines()[0]
    # DDP's gradient all-reduce timed out on rank 0 (gloo's recorder calls it completed)
    assert head.startswith("HANG: rank 1 never reached all_reduce #"), hang.stdout
    assert "it is in slow_eval (collective_job.py:" in head, head
    assert "the job was aborted by the collective timeout" in hang.stdout
    # the listing honours --run-dir and shows where the SIGTERM found rank 1
    listing = probe("--run-dir", str(job["base"] / "run"), "postmortem")
    assert listing.returncode == 0, listing.stderr
    assert "rank 1: SIGTERM received" in listing.stdout, listing.stdout
    assert "slow_eval (" in listing.stdout, listing.stdout
    doc = probe("-t", str(job_dir), "doctor")
    assert doc.returncode == 4 and "no problem found" not in doc.stdout, doc.stdout
    assert "[critical] HANG: rank 1 never reached" in doc.stdout, doc.stdout
