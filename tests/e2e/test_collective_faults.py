"""Collective faults on real 2-rank gloo jobs (tests/programs/collective_job.py): a collective only
rank 0 calls (gloo aborts rank 0 on the size it receives), read after the job died; and a rank
whose DataLoader worker 1 is stuck in ``__getitem__``, so the other rank waits in DDP's gradient
all-reduce until the process group's timeout kills the job: read live (the stuck worker named
by `probe hang`, every rank's workers by `probe backtrace --children`, `probe health`), then
from the post-mortem copies (the rank that never arrived).

Both jobs run side by side in one module fixture and die on their own. Every probe command runs
in the fixture, each as soon as what it reads exists and independent ones at once (the
rank-0-only copy is read while the other job waits for its timeout); the tests assert on the
answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.procs import kill_all
from tests.support import PROGRAMS, python_env, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

#: The process group's timeout of the stuck-loader job: room for the live reads before it (3
#: probe calls at once; at load ~30 on 2 cores one call can take 10 s or more).
LOADER_TIMEOUT_S = "25"
#: How long each live read is retried (the job dies at the timeout anyway).
LIVE_S = 25


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


def _after_death(pool: ThreadPoolExecutor, job: dict, *commands: tuple[str, ...]) -> dict:
    """Wait for ``job``'s copy, then run ``commands`` on it at once (``{}`` is the copy)."""
    job_dir = _dead_copy(job)
    runs = {c: pool.submit(probe, *(str(job_dir) if a == "{}" else a for a in c))
            for c in commands}
    return {"dir": job_dir, **{c: f.result() for c, f in runs.items()}}


def _hung(url: str, tmp: Path) -> subprocess.CompletedProcess[str] | None:
    """`probe health` once it says rank 1 is hung (each watchdog measures its own rank's
    steps: rank 0 may be called hung first)."""
    h = probe("-t", url, "--json", "health", "--stall", "2", "--no-straggler", "--exclude-file",
              str(tmp / "exclude"))
    ranks = json.loads(h.stdout).get("ranks") or [] if h.returncode == 4 else []
    return h if [r.get("state") for r in ranks][1:2] == ["hung"] else None


def _live_loader(pool: ThreadPoolExecutor, job: dict, tmp: Path) -> dict[str, Any]:
    """While rank 1 waits for its stuck worker (before the timeout kills the job): the hang
    verdict, every rank's children and a scheduler's health poll, asked at once."""
    ready = job["base"] / "ready"
    wait_until(lambda: all((ready / f"rank{r}.json").exists() for r in range(2)), 120,
               "the loader job's ranks never became ready")
    url = json.loads((ready / "rank0.json").read_text())["url"].removeprefix("http://")
    asks: dict[str, Future] = {
        "hang": pool.submit(wait_until, lambda: (h := probe("-t", url, "hang")).returncode == 4
                            and h, LIVE_S, "probe hang never named the stuck loader"),
        "children": pool.submit(
            wait_until, lambda: "making a batch" in (c := probe("-t", url, "backtrace",
                                                                "--children")).stdout and c,
            LIVE_S, "probe backtrace --children never showed a worker making a batch"),
        "health": pool.submit(wait_until, lambda: _hung(url, tmp), LIVE_S,
                              "probe health never said the loader's rank 1 was hung"),
    }
    out: dict[str, Any] = {name: f.result() for name, f in asks.items()}
    # the real worker processes of each rank, while they live (the job dies after this)
    out["workers"] = {r: _worker_pids(json.loads((ready / f"rank{r}.json").read_text())["pid"])
                      for r in range(2)}
    return out


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("collective-faults")
    started = {"rank0_only": _start(tmp, "rank0", "rank0_only"),
               "loader": _start(tmp, "loader", "loader_stuck", "--timeout-s", LOADER_TIMEOUT_S)}
    try:
        with ThreadPoolExecutor(8) as pool:
            rank0 = pool.submit(_after_death, pool, started["rank0_only"],
                                ("-t", "{}", "hang"), ("-t", "{}", "--json", "hang"),
                                ("-t", "{}", "doctor"))
            started["loader"]["live"] = _live_loader(pool, started["loader"], tmp)
            run_dir = str(started["loader"]["base"] / "run")
            started["loader"]["dead"] = _after_death(
                pool, started["loader"], ("-t", "{}", "hang"), ("-t", "{}", "doctor"),
                ("--run-dir", run_dir, "postmortem"))
            started["rank0_only"]["dead"] = rank0.result()
        yield started
    finally:
        for job in started.values():
            kill_all(job["proc"], job["base"] / "run")


def test_rank0_only_collective_is_named_from_the_copies_after_gloo_aborted_it(jobs):
    dead = jobs["rank0_only"]["dead"]
    # rank 0 left its call in the black box: pending when gloo aborted it
    strip = (dead["dir"] / "rank-0" / "collectives.strip").read_bytes().rstrip(b"\0")
    assert b"log_metric" in strip
    hang = dead[("-t", "{}", "hang")]
    assert hang.returncode == 4, hang.stdout + hang.stderr
    head = hang.stdout.splitlines()[0]
    assert head.startswith("COLLECTIVE MISMATCH (different sizes) at #"), hang.stdout
    assert "rank 0 called all_reduce with [1] at collective_job.py:" in head, head
    assert " log_metric where rank 1 called all_reduce with [577] at collective_job.py:" in head
    assert head.endswith("rank 0 is the odd one out"), head
    assert "rank 0 was aborted (SIGABRT) by the backend on this mismatch" in hang.stdout
    assert "copies taken: rank 0 " in hang.stdout
    # the JSON names both sides with their call sites
    body = json.loads(dead[("-t", "{}", "--json", "hang")].stdout)
    m = body["mismatch"]
    assert m["kind"] == "sizes" and m["odd_ranks"] == [0] and body["culprits"] == [0]
    assert set(body["copies_taken_at"]) == {"0", "1"} and all(body["copies_taken_at"].values())
    sites = {tuple(s["ranks"]): s["callsite"] for s in m["sides"]}
    assert sites[(0,)].endswith("log_metric") and sites[(1,)].endswith(" main"), sites
    # doctor: the same culprit, and a summary line that counts it (exit 4)
    doc = dead[("-t", "{}", "doctor")]
    assert doc.returncode == 4, doc.stdout + doc.stderr
    assert "no problem found" not in doc.stdout, doc.stdout
    assert "[critical] COLLECTIVE MISMATCH (different sizes)" in doc.stdout, doc.stdout


def _worker_pids(parent: int) -> set[int]:
    """The pids of ``parent``'s children named as torch names DataLoader workers."""
    out = set()
    for task in Path(f"/proc/{parent}/task").iterdir():
        for pid in (task / "children").read_text().split():
            if Path(f"/proc/{pid}/comm").read_text().strip() == "pt_data_worker":
                out.add(int(pid))
    return out


def test_live_hang_names_the_stuck_dataloader_worker_and_its_line(jobs):
    live = jobs["loader"]["live"]
    hang = live["hang"]
    head = hang.stdout.splitlines()[0]
    # rank 1 waits for a batch that its worker 1 never makes; rank 0 waits for rank 1
    assert head.startswith("HANG: rank 1 never reached all_reduce #"), hang.stdout
    assert "it is in the DataLoader, waiting for a batch from DataLoader worker 1 (pid " in head, \
        hang.stdout
    assert "stuck in read_remote_shard (collective_job.py:" in head, hang.stdout
    assert "DataLoader worker 0 (pid " in hang.stdout  # the idle one, said as such
    # every rank's workers, read from outside: 2 ranks x 2 workers, with pids and ids
    kids = live["children"].stdout
    assert "Rank 0 (pid " in kids and "Rank 1 (pid " in kids, kids
    for r in (0, 1):
        section = kids.split(f"Rank {r} (pid ", 1)[1].split("\nRank ", 1)[0]
        assert "): 2 child processes, read from outside by its watchdog" in section, section
        pids = live["workers"][r]  # the real worker processes of that rank
        assert len(pids) == 2, pids
        for wid in (0, 1):
            assert any(f"DataLoader worker {wid} (pid {p})" in section for p in pids), section
    stuck = kids.split("Rank 1 (pid ", 1)[1]
    assert "DataLoader worker 1 (pid " in stuck and ": making a batch" in stuck, stuck
    assert "read_remote_shard (" in stuck and "__getitem__ (" in stuck, stuck


def test_health_says_hung_and_every_rank_writes_its_copy_at_once(jobs):
    body = json.loads(jobs["loader"]["live"]["health"].stdout)
    assert body["job"] == "hung", body
    # rank 1 waits for its worker; rank 0 waits for it in all_reduce (hung too once its own
    # limit passes: each watchdog measures its own rank's steps)
    assert [r["rank"] for r in body["ranks"]] == [0, 1] and body["ranks"][1]["state"] == "hung"
    assert "no optimizer step for" in body["ranks"][1]["reason"]
    assert body["copies_written"] == [0, 1] and body["exclude_hosts"] == []


def test_stall_until_the_timeout_names_the_rank_that_never_arrived(jobs):
    dead = jobs["loader"]["dead"]
    hang = dead[("-t", "{}", "hang")]
    assert hang.returncode == 4, hang.stdout + hang.stderr
    head = hang.stdout.splitlines()[0]
    # DDP's gradient all-reduce timed out on rank 0 (gloo's recorder calls it completed)
    assert head.startswith("HANG: rank 1 never reached all_reduce #"), hang.stdout
    assert "it is in the DataLoader, waiting for a batch" in head, head
    assert "the job was aborted by the collective timeout" in hang.stdout
    # the listing honours --run-dir and shows where the SIGTERM found rank 1
    listing = dead[("--run-dir", str(jobs["loader"]["base"] / "run"), "postmortem")]
    assert listing.returncode == 0, listing.stderr
    assert "rank 1: SIGTERM received" in listing.stdout, listing.stdout
    assert "main (" in listing.stdout and "dataloader.py" in listing.stdout, listing.stdout
    doc = dead[("-t", "{}", "doctor")]
    assert doc.returncode == 4 and "no problem found" not in doc.stdout, doc.stdout
    assert "[critical] HANG: rank 1 never reached" in doc.stdout, doc.stdout
