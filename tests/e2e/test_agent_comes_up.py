"""The agent comes up, or says loudly why not (issue 20, item 5): two jobs on one node with the
same base port, a run dir another uid made first, and the files a SIGKILLed job leaves."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.e2e.test_cluster import free_base_port
from tests.e2e.training import probe, training_job
from tests.foreign import FOREIGN_UID, need_root
from tests.support import python_env, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def _ranks_behind(address: str, run_dir: Path) -> list[tuple[int, int]]:
    out = probe("--run-dir", str(run_dir), "-t", address, "--json", "info")
    assert out.returncode == 0, out.stdout + out.stderr
    return sorted((b["rank"], b["pid"]) for b in json.loads(out.stdout))


def test_two_jobs_with_the_same_base_port_are_both_reachable(tmp_path: Path):
    # GIVEN two 2-rank jobs on this node, both with the same base port (as with the default)
    base = free_base_port(8)
    run_dir = tmp_path / "run"
    env = {"PROBE_PORT": str(base), "PROBE_RUN_DIR": str(run_dir), "PROBE_TRACE": "off"}
    with ExitStack() as stack, ExitStack() as first:
        jobs, launchers = [], []
        for name, owner in (("one", first), ("two", stack)):
            (tmp_path / name).mkdir()
            proc, infos = owner.enter_context(
                training_job(tmp_path / name, nproc=2, env=env, timeout=120))
            jobs.append(infos)
            launchers.append(proc.pid)
        # THEN the second job's ranks took other ports instead of failing to start
        urls = [[i["url"] for i in infos] for infos in jobs]
        assert urls[0] == [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
        assert all(u.startswith("http://127.0.0.1:") for u in urls[1])
        assert not set(urls[0]) & set(urls[1])
        pids = [sorted((i["rank"], i["pid"]) for i in infos) for infos in jobs]
        # AND each job's rank-0 address reaches that job's two ranks, and only them
        assert _ranks_behind(f"127.0.0.1:{base}", run_dir) == pids[0]
        assert _ranks_behind(urls[1][0].removeprefix("http://"), run_dir) == pids[1]
        # AND `probe ps` lists all four agents as answering
        ps = probe("--run-dir", str(run_dir), "--json", "ps")
        answering = {r["pid"] for r in json.loads(ps.stdout) if r["agent"] == "answering"}
        assert {p for _, p in pids[0] + pids[1]} <= answering
        # AND the torchrun launchers are listed as launchers, not as injectable
        agent_of = {r["pid"]: r["agent"] for r in json.loads(ps.stdout)}
        assert [agent_of.get(p) for p in launchers] == ["launcher", "launcher"], ps.stdout
        # AND a command without -t says which jobs it found and how to pick each
        which = probe("--run-dir", str(run_dir), "eval", "1")
        assert which.returncode == 2, which.stdout + which.stderr
        assert "2 jobs have agents" in which.stderr, which.stderr
        for job in pids:
            assert f"ranks 0,1 (pids {job[0][1]},{job[1][1]}): probe -t {job[0][1]}" \
                in which.stderr, which.stderr
        # AND once one job is gone, the other is found with no -t, through its rank 0
        first.close()
        one = probe("--run-dir", str(run_dir), "--json", "eval", "import os; os.getpid()")
        assert one.returncode == 0, one.stdout + one.stderr
        assert [(b["rank"], int(b["result"])) for b in json.loads(one.stdout)] == pids[1]


def _start(tmp: Path, run_dir: Path, **env: str) -> tuple[subprocess.Popen[str], dict]:
    ready = tmp / "ready.json"
    code = ("import json, os, time, probe_agent\n"
            "a = probe_agent.start()\n"
            f"open({str(ready)!r} + '.t', 'w').write(json.dumps("
            "{'pid': os.getpid(), 'unix': a.unix_path}))\n"
            f"os.replace({str(ready)!r} + '.t', {str(ready)!r})\n"
            "time.sleep(300)\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", code], text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=python_env(PROBE_RUN_DIR=str(run_dir), PROBE_PORT="0", PROBE_TRACE="off", **env),
        start_new_session=True)

    def ready_now() -> bool:
        assert proc.poll() is None, proc.stdout.read()
        return ready.exists()

    wait_until(ready_now, 60, "the agent never started")
    return proc, json.loads(ready.read_text())


def test_a_run_dir_another_uid_made_first_falls_back_and_says_why(tmp_path: Path):
    need_root()
    # GIVEN another user made the run dir first (as anyone can, in /tmp)
    taken = tmp_path / "probe-run"
    taken.mkdir(mode=0o777)
    os.chown(taken, FOREIGN_UID, FOREIGN_UID)
    proc, info = _start(tmp_path, taken, PROBE_WATCHDOG="0")
    try:
        # THEN the agent started in a private directory of its own, and said why, once
        sock = Path(info["unix"])
        assert sock.parent != taken and sock.parent.name.startswith(f"probe-{os.getuid()}-")
        assert oct(sock.parent.stat().st_mode & 0o777) == "0o700"
        # AND `probe PID` finds it there with no flag, and `probe ps` lists it
        out = probe("--run-dir", str(taken), str(info["pid"]), "eval", "6*7")
        assert out.returncode == 0 and out.stdout.strip() == "42", out.stdout + out.stderr
        ps = probe("--run-dir", str(taken), "--json", "ps")
        assert any(r["pid"] == info["pid"] and r["agent"] == "answering"
                   for r in json.loads(ps.stdout))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        log = proc.stdout.read()
        proc.stdout.close()
        # the private run dir holds the rank's files and its post-mortem copy
        shutil.rmtree(sock.parent)
    assert f"belongs to uid {FOREIGN_UID}" in log and "using /tmp/probe-" in log, log


def test_ps_clean_removes_what_a_killed_job_left(tmp_path: Path):
    # GIVEN a rank (with its watchdog) killed with SIGKILL, watchdog included
    run_dir = tmp_path / "run"
    proc, info = _start(tmp_path, run_dir, PROBE_WATCHDOG="1", PROBE_WATCHDOG_GRACE_S="600")
    rec = json.loads((run_dir / f"{info['pid']}.watchdog.json").read_text())
    os.kill(rec["watchdog_pid"], signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    left = sorted(p.name for p in run_dir.iterdir() if p.name.startswith(f"{info['pid']}."))
    assert f"{info['pid']}.sock" in left
    # WHEN `probe ps` runs, THEN the stale socket is not listed as an agent, and it says so
    ps = probe("--run-dir", str(run_dir), "ps")
    assert str(info["pid"]) not in ps.stdout and "stale agent sockets" in ps.stderr
    # AND `probe ps --clean` removes every file of the dead process
    clean = probe("--run-dir", str(run_dir), "ps", "--clean")
    # (at least those: it also sweeps this uid's fallback run dirs, which may hold others')
    removed = re.search(r"removed (\d+) files", clean.stderr)
    assert clean.returncode == 0 and removed and int(removed[1]) >= len(left), clean.stderr
    assert not [p for p in run_dir.iterdir() if p.name.startswith(f"{info['pid']}.")]
