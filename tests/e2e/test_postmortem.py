"""After the crash: each rank's tables on disk, and the same commands on the dead job.

Five real jobs run side by side (one module fixture, to keep the wall time down): a 2-rank gloo
job killed by its own collective timeout (started first: the others start while it waits out its
timeout), a 2-rank job where rank 1 raises, one process killed with SIGKILL, one SIGABRT and one
clean exit. Every assertion reads what those jobs left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.procs import kill_all
from tests.support import PROGRAMS, python_env, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TOKEN = "pm-test-token-7f3a9c1e5b"
EVERY_S = 1.0
#: The timeout job's process-group timeout: the test waits it out, so short; its ranks stall at
#: step HANG_AT, after enough collectives (2 x 9 gaps) that the hang verdict's rhythm (4 x the 90th
#: percentile gap) ignores rank 0's first wait for rank 1's start-up, even at load 18.
COLLECTIVE_TIMEOUT_S = 10
HANG_AT = 10


def _start(tmp: Path, name: str, mode: str, nproc: int, **env: str) -> dict:
    base = tmp / name
    (base / "ready").mkdir(parents=True)
    os.chmod(base, 0o700)
    cmd = [sys.executable]
    if nproc:
        cmd += ["-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0"]
    cmd += [str(PROGRAMS / "postmortem_job.py"), "--mode", mode, "--ready-dir",
            str(base / "ready"), "--at", str({"loop": 20, "hang": HANG_AT}.get(mode, 5))]
    if mode == "hang":
        cmd += ["--timeout-s", str(COLLECTIVE_TIMEOUT_S)]
    child_env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(base / "run"),
                           PROBE_WATCHDOG="1", PROBE_WATCHDOG_GRACE_S="20",
                           PROBE_POSTMORTEM_EVERY_S=str(EVERY_S), **env)
    proc = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            cwd=str(base))
    return {"proc": proc, "base": base, "root": base / "run" / "postmortem"}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("postmortem")
    started = {"timeout": _start(tmp, "timeout", "hang", 2, PROBE_TOKEN=TOKEN)}
    # The timeout job is the long one (the first test waits out its timeout): the others start
    # once its ranks have stalled, so their start-up runs during that wait, not beside its own.
    # (Bounded, and an early end counts: its own test then says what went wrong.)
    timeout_ready = started["timeout"]["base"] / "ready"
    with contextlib.suppress(AssertionError):
        wait_until(lambda: started["timeout"]["proc"].poll() is not None
                   or all((timeout_ready / f"rank{r}.json").exists() for r in range(2)),
                   120, "the timeout job's ranks never reached their stall")
    started.update({
        "raise": _start(tmp, "raise", "raise", 2),
        "kill": _start(tmp, "kill", "loop", 0),
        "clean": _start(tmp, "clean", "clean", 0),
        "abort": _start(tmp, "abort", "abort", 0),
    })
    yield started
    for job in started.values():
        kill_all(job["proc"], job["base"] / "run")


def _ended(job: dict, timeout: float = 150) -> int:
    proc = job["proc"]
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the job did not end:\n{proc.stdout.read()}") from None


def _job_dir(job: dict) -> Path:
    def one() -> Path | None:
        dirs = [p for p in job["root"].glob("*") if p.is_dir()] if job["root"].exists() else []
        return dirs[0] if len(dirs) == 1 else None

    return wait_until(one, 30, f"no post-mortem job directory under {job['root']}")


def _deaths(job_dir: Path, ranks: int) -> None:
    """The watchdogs record each death (death.json) soon after the rank is gone."""
    wait_until(lambda: all((job_dir / f"rank-{r}" / "death.json").exists() for r in range(ranks)),
               30, f"the watchdogs never recorded the deaths in {job_dir}")


def probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "probe_cli", *args], env=python_env(),
                          capture_output=True, text=True, timeout=90)


def test_collective_timeout_listed_and_hang_names_the_stalled_rank(jobs):
    job = jobs["timeout"]
    assert _ended(job) != 0
    job_dir = _job_dir(job)
    _deaths(job_dir, 2)

    listing = probe("postmortem", str(job["root"]))
    assert listing.returncode == 0, listing.stderr
    out = listing.stdout
    assert f"{job_dir}  ranks 0,1 of 2" in out, out
    # First to go wrong first: rank 0's timed-out all_reduce, then rank 1 torn down.
    assert out.index("rank 0: uncaught RuntimeError") < out.index("rank 1: SIGTERM received")
    assert "Timed out" in out

    hang = probe("-t", str(job_dir), "hang")
    assert hang.returncode == 4, hang.stdout + hang.stderr
    head = hang.stdout.splitlines()[0]
    assert f"rank 1 never reached all_reduce #{HANG_AT}" in head, hang.stdout
    assert "do_hang (postmortem_job.py" in head, hang.stdout
    assert "the job was aborted by the collective timeout" in hang.stdout
    # The wait is aged on the copy's clock (rank 0's end), not on today's: about the timeout.
    waited = float(head.rsplit("for ", 1)[1].split(" s")[0])
    assert 0.75 * COLLECTIVE_TIMEOUT_S <= waited <= COLLECTIVE_TIMEOUT_S + 20, head
    print(listing.stdout, hang.stdout, sep="\n")

    # The same table names as on a live job, one rank column across the copy.
    q = probe("-t", str(job_dir), "--json", "query",
              "SELECT count(*) AS n, max(step) AS last FROM python.steps")
    assert q.returncode == 0, q.stderr
    bodies = json.loads(q.stdout)
    assert [b["rank"] for b in bodies] == [0, 1]
    assert all(b["rows"][0][0] >= 4 for b in bodies), bodies


def test_the_copy_is_private_and_holds_no_token(jobs):
    job = jobs["timeout"]
    _ended(job)
    job_dir = _job_dir(job)
    for path in [job["root"], job_dir, *job_dir.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to act as another uid")
    meta = job_dir / "rank-0" / "meta.json"
    other = subprocess.run([setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups",
                            "cat", str(meta)], capture_output=True, text=True, timeout=30)
    assert other.returncode != 0 and "Permission denied" in other.stderr, other
    listing = subprocess.run([setpriv, "--reuid", "65534", "--regid", "65534",
                              "--clear-groups", "ls", str(job_dir)],
                             capture_output=True, text=True, timeout=30)
    assert listing.returncode != 0, listing


def test_a_raising_rank_doctor_shows_the_traceback_and_the_steps_before(jobs):
    job = jobs["raise"]
    assert _ended(job) != 0
    job_dir = _job_dir(job)
    _deaths(job_dir, 2)
    doc = probe("-t", str(job_dir), "doctor")
    assert doc.returncode == 4, doc.stdout + doc.stderr
    lines = doc.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("  rank "))
    assert lines[first].startswith("  rank 1: uncaught ValueError: loss went bad at step 5"), \
        doc.stdout
    assert "main (" in lines[first + 1] and "postmortem_job.py" in lines[first + 1], doc.stdout
    steps = next(line for line in lines if "rank 1's last steps:" in line)
    numbers = [int(part.split(" (")[0]) for part in steps.split(": ", 1)[1].split(", ")]
    assert len(numbers) >= 3 and numbers == sorted(numbers), steps


def test_sigkill_leaves_a_copy_at_most_one_refresh_old(jobs):
    job = jobs["kill"]
    wait_until(lambda: (job["base"] / "ready" / "rank0.json").exists(), 120,
               "the looping job never reached step 20")
    job_dir = _job_dir(job)
    meta = job_dir / "rank-0" / "meta.json"
    first = json.loads(meta.read_text())["refreshes"] if meta.exists() else 0
    wait_until(lambda: meta.exists() and json.loads(meta.read_text())["refreshes"] >= first + 2,
               30, "the copy was not refreshed")
    os.kill(job["proc"].pid, signal.SIGKILL)
    killed_at = time.time()
    job["proc"].wait(10)
    _deaths(job_dir, 1)
    q = probe("-t", str(job_dir), "--json", "query", "SELECT max(end_time) FROM python.steps")
    assert q.returncode == 0, q.stderr
    last = json.loads(q.stdout)[0]["rows"][0][0]
    # One refresh period, plus the time a refresh itself takes on a loaded machine.
    assert killed_at - last <= EVERY_S + 2.0, (killed_at, last)
    listing = probe("postmortem", str(job["root"]))
    assert "rank 0: killed by signal 9 (SIGKILL)" in listing.stdout, listing.stdout


def test_sigabrt_is_recorded_by_the_watchdog_with_the_fatal_stack(jobs):
    """Nothing runs in a rank at SIGABRT (a process group's abort): the watchdog writes the
    death, with faulthandler's stack, beside the last copy."""
    job = jobs["abort"]
    assert _ended(job) == -signal.SIGABRT
    job_dir = _job_dir(job)
    _deaths(job_dir, 1)
    death = json.loads((job_dir / "rank-0" / "death.json").read_text())
    assert death["exit"]["signal"] == signal.SIGABRT
    assert death["backtrace"]["route"] == "faulthandler at the fatal signal"
    listing = probe("postmortem", str(job["root"]))
    assert "rank 0: killed by signal 6 (SIGABRT)" in listing.stdout, listing.stdout
    bt = probe("-t", str(job_dir), "backtrace")
    assert "main (" in bt.stdout and "postmortem_job.py" in bt.stdout, bt.stdout


def test_a_clean_exit_leaves_nothing(jobs):
    job = jobs["clean"]
    assert _ended(job) == 0
    # The watchdog decides (it sees the exit status): the directory goes once it has.
    wait_until(lambda: not any(job["root"].glob("*/rank-*")), 30,
               "a clean exit left its post-mortem copy")
    assert not [p for p in job["root"].glob("*") if p.is_dir()]


def test_sigterm_reaches_a_rank_blocked_in_c_and_its_copy_is_written(tmp_path: Path):
    """The end hooks must not change how a rank stuck in a C wait dies of SIGTERM: the
    helper thread writes the copy and carries out the default action."""
    os.chmod(tmp_path, 0o700)
    (tmp_path / "ready").mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(PROGRAMS / "postmortem_blocked.py"), str(tmp_path / "ready")],
        env=python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(tmp_path / "run"),
                       PROBE_WATCHDOG="0"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_until(lambda: (tmp_path / "ready" / "rank0.json").exists() or proc.poll(), 120,
                   "the blocked program never started")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == -signal.SIGTERM  # killed by it, as without the agent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    end = json.loads(next((tmp_path / "run" / "postmortem").glob("*/rank-0/end.json"))
                     .read_text())
    assert end["kind"] == "signal" and end["signal_name"] == "SIGTERM"
    assert [f["func"] for f in end["stack"][:3]][1] == "blocked_in_c", end["stack"]


def test_a_forked_workers_sigterm_is_not_the_ranks_end(tmp_path: Path):
    os.chmod(tmp_path, 0o700)
    out = subprocess.run(
        [sys.executable, str(PROGRAMS / "postmortem_fork.py")],
        env=python_env(PROBE_PORT="0", PROBE_RUN_DIR=str(tmp_path / "run"), PROBE_WATCHDOG="0",
                       PROBE_POSTMORTEM="always"),
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and f"alive {int(signal.SIGTERM)}" in out.stdout, out
    end = json.loads(next((tmp_path / "run" / "postmortem").glob("*/rank-0/end.json"))
                     .read_text())
    assert end["kind"] == "exit", end
