"""What a newcomer meets first: `probe --version`, `probe ps` listing agents (not every Python
process), and a refused connection's hint saying how to start an agent."""

from __future__ import annotations

import json
import subprocess
import sys

from probe_cli.main import main
from tests.support import python_env
from tests.unit.cli_server import closed_port


def test_version_prints_the_packages_version(capsys):
    import probe_agent._version as v

    # WHEN `probe --version`
    code = main(["--version"])
    out, _ = capsys.readouterr()
    # THEN one line with the version, exit 0
    assert code == 0 and out.strip() == f"probe {v.__version__}"


def test_refused_connection_says_how_to_start_an_agent(capsys):
    code = main(["-t", f"127.0.0.1:{closed_port()}", "info"])
    _, err = capsys.readouterr()
    assert code == 1 and "connection refused" in err
    assert "PROBE=1" in err and "probe ps" in err, err


def test_ps_lists_agents_and_counts_other_pythons(capsys, tmp_path):
    # GIVEN a Python process of ours without an agent
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env=python_env())
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir(mode=0o700)
        # WHEN `probe ps` (no agent in the run dir), then `probe ps --all`
        code = main(["--run-dir", str(run_dir), "--json", "ps"])
        out, err = capsys.readouterr()
        assert code == 0
        shown = {r["pid"] for r in json.loads(out)}
        code = main(["--run-dir", str(run_dir), "--json", "ps", "--all"])
        every = {r["pid"]: r for r in json.loads(capsys.readouterr()[0])}
    finally:
        other.kill()
        other.wait()
    # THEN it is not listed by default, but counted with the flag that lists it
    assert other.pid not in shown
    assert "other Python process" in err and "--all" in err, err
    # AND --all lists it with what inject can do
    assert every[other.pid]["agent"] in ("injectable", "no")


def test_query_help_lists_the_tables(capsys):
    import re

    from tests.support import ROOT

    code = main(["query", "--help"])
    out, _ = capsys.readouterr()
    schema = (ROOT / "sql" / "schema.sql").read_text()
    tables = re.findall(r"^CREATE (?:TABLE|VIEW) IF NOT EXISTS (python\.\w+)", schema, re.M)
    assert code == 0 and len(tables) > 10
    assert all(t in out for t in tables), out


def test_the_license_file_pyproject_declares_exists():
    import tomllib

    from tests.support import ROOT

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    files = project.get("license-files") or ["LICENSE"]
    assert project["license"] == "Apache-2.0"
    for name in files:
        text = (ROOT / name).read_text()
        assert "Apache License" in text and "Version 2.0" in text


def test_hang_on_a_job_that_has_ended_exits_1_naming_the_address(capsys):
    # GIVEN nothing listens at the target (the job finished)
    port = closed_port()
    code = main(["-t", f"127.0.0.1:{port}", "hang"])
    out, err = capsys.readouterr()
    # THEN nothing reachable: exit 1 with the address, not "rank -1 did not answer" (exit 4)
    assert code == 1, (out, err)
    assert "rank -1" not in out + err
    assert f"127.0.0.1:{port}" in err and "connection refused" in err


def test_build_native_runs_with_several_jobs_in_the_run_dir(capsys, tmp_path):
    # GIVEN a run dir with the agents of two jobs (two live processes, each its own job)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        for p in procs:
            (run_dir / f"{p.pid}.sock").write_text("")
            (run_dir / f"{p.pid}.json").write_text(json.dumps({"rank": 0}))
        # WHEN `probe build-native` runs (with an interpreter that fails at once)
        code = main(["--run-dir", str(run_dir), "build-native", "--python", "/bin/false"])
        _, err = capsys.readouterr()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    # THEN it is not refused for want of -t: it ran the build (which failed here)
    assert "jobs have agents" not in err, err
    assert code == 1 and "the build exited" in err, err
