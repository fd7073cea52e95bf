"""The wheel carries sql/, the .pth hook and the C++ sources; PROBE unset costs nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support import ROOT, python_env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("hatchling")
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = out.glob("probe_torch-*.whl")
    return whl


def test_wheel_ships_sql_autostart_hook_and_cpp_sources(wheel):
    from probe_agent.collectors.tracer.trace_native import SOURCES

    names = set(zipfile.ZipFile(wheel).namelist())
    # the tracer's C++ hot path is built from these on the user's machine
    assert {f"probe_agent/collectors/tracer/{src.name}" for src in SOURCES} <= names
    assert "probe_agent/sql/schema.sql" in names
    assert any(n.startswith("probe_agent/sql/queries/") for n in names) or not list(
        (ROOT / "sql" / "queries").glob("*.sql")
    )
    assert "probe_autostart.pth" in names
    assert "probe_cli/__main__.py" in names
    # the protocol package both sides import: every module of it, or the CLI fails to start
    protocol = {f"probe_protocol/{p.name}" for p in (ROOT / "probe_protocol").glob("*.py")}
    assert protocol and protocol <= names, protocol - names


def test_wheel_does_not_require_torch(wheel):
    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    requires = [line for line in text.splitlines() if line.startswith("Requires-Dist:")]
    assert not [r for r in requires if "torch" in r.split(";")[0]], requires


def test_pth_hook_imports_nothing_without_probe():
    # GIVEN PROBE unset, WHEN an interpreter starts with the .pth installed
    code = ("import sys; print(sorted(m for m in sys.modules "
            "if m.startswith(('probe', 'duckdb', 'fastapi', 'torch'))))")
    out = subprocess.run(
        [sys.executable, "-c", code], env=python_env(), capture_output=True, text=True, timeout=60
    )
    # THEN nothing of ours (or our dependencies) was imported
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_pth_hook_starts_agent_with_probe_set(tmp_path):
    code = (
        "import sys, probe_agent.process as a; ag = a.current(); "
        "print(ag is not None and ag.url is not None)"
    )
    env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(tmp_path / "r"),
                     PROBE_WATCHDOG="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True", out.stderr


def test_pth_hook_bad_config_warns_and_program_still_runs(tmp_path):
    env = python_env(PROBE="1", PROBE_PORT="notaport", PROBE_RUN_DIR=str(tmp_path / "r"))
    out = subprocess.run(
        [sys.executable, "-c", "print('trained')"], env=env, capture_output=True, text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "trained"
    assert "probe: agent not started: PROBE_PORT=notaport is invalid" in out.stderr


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["python", "train.py"], True),
        (["python", "-m", "torch.distributed.run", "--nproc-per-node=2", "t.py"], False),
        (["/venv/bin/python", "/venv/bin/torchrun", "t.py"], False),
        (["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"], False),
        (["python", "-m", "torch._inductor.compile_worker", "--pool"], False),
        (["python", "/home/me/deepspeed_runs/train.py"], True),
    ],
    ids=["script", "torchrun-module", "torchrun-script", "mp-spawn", "compile-worker",
         "path-mentions-deepspeed"],
)
def test_autostart_skips_launchers(argv, expected):
    from probe_agent._autostart import should_start

    assert should_start(argv, {}, 1) is expected


def test_autostart_skips_children_of_an_agent():
    from probe_agent._autostart import should_start

    assert should_start(["python", "w.py"], {"PROBE_AGENT_PID": "10"}, 11) is False
    assert should_start(["python", "w.py"], {"PROBE_AGENT_PID": "11"}, 11) is True


def test_a_stopped_agent_is_no_longer_above_the_processes_started_after_it(make_agent):
    """PROBE_AGENT_PID tells a child that an agent runs above it (so it waits for a process
    group before starting its own); once the agent stops, it must not say so any more."""
    import probe_agent
    from probe_agent._autostart import should_start

    before = os.environ.get("PROBE_AGENT_PID")
    # GIVEN an agent running in this process: a child of it defers
    make_agent(trace="off")
    assert os.environ["PROBE_AGENT_PID"] == str(os.getpid())
    assert should_start(["python", "w.py"], dict(os.environ), os.getpid() + 1) is False
    # WHEN it stops, THEN the variable is as it was, and a child with PROBE=1 starts its own
    probe_agent.stop()
    assert os.environ.get("PROBE_AGENT_PID") == before
    assert should_start(["python", "w.py"], dict(os.environ), os.getpid() + 1) is True


#: Wheels of the dependencies, for installing offline (this machine's local index; CI images
#: set PROBE_WHEELHOUSE). Without one the install test skips: it must never reach the network.
WHEELHOUSE = os.environ.get("PROBE_WHEELHOUSE", "/opt/pypi/files")


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_the_readmes_install_lines_work_offline_from_a_clean_venv(wheel, tmp_path):
    """README: `pip install 'probe-torch[agent]'` in the training environment (the agent, with
    py-spy for the watchdog), `pip install probe-torch` for the CLI alone on a laptop."""
    if not os.path.isdir(WHEELHOUSE):
        pytest.skip(f"no local wheelhouse at {WHEELHOUSE} (set PROBE_WHEELHOUSE)")
    readme = (ROOT / "README.md").read_text()
    assert "pip install 'probe-torch[agent]'" in readme and "`pip install probe-torch`" in readme
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env["PIP_CONFIG_FILE"] = os.devnull  # this machine's index settings play no part

    def venv(name: str, spec: str) -> Path:
        d = tmp_path / name
        subprocess.run([sys.executable, "-m", "venv", str(d)], check=True, timeout=120)
        pip = subprocess.run(
            [str(d / "bin" / "python"), "-m", "pip", "install", "--no-index", "--find-links",
             str(wheel.parent), "--find-links", WHEELHOUSE, spec],
            capture_output=True, text=True, timeout=480, env=env)
        assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
        return d / "bin"

    def run(bindir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(bindir / argv[0]), *argv[1:]], capture_output=True,
                              text=True, timeout=120, env=env, cwd=tmp_path)

    # WHEN the CLI alone is installed, THEN `probe` runs, without DuckDB or the agent's server
    cli = venv("laptop", "probe-torch")
    assert run(cli, "probe", "--help").returncode == 0
    missing = run(cli, "python", "-c", "import duckdb")
    assert missing.returncode != 0
    # WHEN the agent extra is installed, THEN its store, server and the watchdog's py-spy are in
    agent = venv("training", "probe-torch[agent]")
    ok = run(agent, "python", "-c", "import probe_agent.store.store, probe_agent.serving.app, "
                                    "probe_cli.main; print('ok')")
    assert ok.stdout.strip() == "ok", ok.stderr
    assert run(agent, "py-spy", "--version").returncode == 0
    assert run(agent, "probe", "--help").returncode == 0
