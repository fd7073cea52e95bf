"""`probe compare` on real runs: post-mortem copies of a small job kept with
PROBE_POSTMORTEM=always (two of one config, one with a module slowed) and one live job.

One module fixture starts the four jobs side by side (the step is mostly a fixed host wait, so
they hardly disturb each other) and every test reads what they left.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.procs import kill_all
from tests.support import PROGRAMS, python_env, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

STEPS = 60
SLOW_MS = 40.0  # blocks b1's forward sleeps this long: the step is ~70 ms instead of ~30


def _start(tmp: Path, name: str, *args: str) -> dict:
    base = tmp / name
    (base / "ready").mkdir(parents=True)
    (base / "run").mkdir(mode=0o700)
    env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(base / "run"),
                     PROBE_POSTMORTEM="always", PROBE_TRACE="every:2", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, str(PROGRAMS / "compare_job.py"), "--ready-dir", str(base / "ready"),
         "--steps", str(STEPS), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, cwd=str(base))
    return {"proc": proc, "base": base}


def _copy(job: dict) -> str:
    """The job's post-mortem directory (one job per run dir)."""
    root = job["base"] / "run" / "postmortem"
    dirs = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    assert len(dirs) == 1, (list(root.iterdir()) if root.is_dir() else root,
                            job["proc"].stdout.read() if job["proc"].stdout else "")
    return str(dirs[0])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("compare")
    stop = tmp / "stop"
    jobs = {"base": _start(tmp, "base"), "again": _start(tmp, "again"),
            "slowed": _start(tmp, "slowed", "--slow-ms", str(SLOW_MS)),
            "live": _start(tmp, "live", "--stop-file", str(stop))}
    try:
        for name in ("base", "again", "slowed"):
            rc = jobs[name]["proc"].wait(timeout=180)
            assert rc == 0, jobs[name]["proc"].stdout.read()
        wait_until(lambda: (jobs["live"]["base"] / "ready" / "rank0.json").exists(), 120,
                   "the live job never took its first 40 steps")
        info = json.loads((jobs["live"]["base"] / "ready" / "rank0.json").read_text())
        yield {"base": _copy(jobs["base"]), "again": _copy(jobs["again"]),
               "slowed": _copy(jobs["slowed"]), "live": str(info["pid"]),
               "live_env": python_env(PROBE_RUN_DIR=str(jobs["live"]["base"] / "run"))}
    finally:
        stop.touch()
        for job in jobs.values():
            kill_all(job["proc"], job["base"] / "run")
            if job["proc"].stdout:
                job["proc"].stdout.close()


def _compare(a: str, b: str, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "probe_cli", "compare", a, b, *extra],
                          env=env or python_env(), capture_output=True, text=True, timeout=120)


def test_a_slowed_module_is_named_first_and_exits_4(runs):
    # GIVEN two copies: the second with one module's forward slowed
    # WHEN they are compared
    r = _compare(runs["base"], runs["slowed"])
    # THEN the regression is found, and the slowed module leads the explanation
    assert r.returncode == 4, r.stdout + r.stderr
    head = r.stdout.splitlines()[0]
    assert head.startswith("REGRESSION: B's step is"), r.stdout
    assert "first: b1 forward" in head, r.stdout
    module_rows = [ln for ln in r.stdout.splitlines() if ln.startswith("b1 ")]
    assert module_rows and "forward" in module_rows[0], r.stdout


def test_two_runs_of_one_config_are_quiet(runs):
    r = _compare(runs["base"], runs["again"], "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    body = json.loads(r.stdout)
    assert body["problem"] is False
    assert body["headline"].startswith("no change beyond 5%"), body["headline"]
    assert body["counts"]["a"]["steps"] >= STEPS - 5 and body["counts"]["a"]["traced_steps"] >= 20
    # both runs are one config: no setting differs
    assert [s for s in body["settings"] if s["setting"] != "command"] == [], body["settings"]


def test_live_against_a_copy_and_slower_only(runs):
    # GIVEN the slowed copy as A and a live job of the base config as B
    r = _compare(runs["slowed"], runs["live"], "--json", env=runs["live_env"])
    # THEN B is faster: found (exit 4) by default, with the slowed module leading the other way
    assert r.returncode == 4, r.stdout + r.stderr
    body = json.loads(r.stdout)
    assert body["headline"].startswith("IMPROVEMENT"), body["headline"]
    top = body["modules"][0]
    assert (top["module"], top["part"]) == ("b1", "forward") and top["change"] < 0, top
    # AND a regressions-only gate lets an improvement pass
    r2 = _compare(runs["slowed"], runs["live"], "--slower-only", env=runs["live_env"])
    assert r2.returncode == 0, r2.stdout + r2.stderr


def test_an_unreachable_side_is_one_line_and_exit_1(runs, tmp_path):
    missing = tmp_path / "nothing-here"
    r = _compare(runs["base"], str(missing))
    assert r.returncode in (1, 2), r.stdout + r.stderr
    assert r.stderr.startswith("probe: "), r.stderr
