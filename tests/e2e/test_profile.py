"""`probe profile` and `probe flame` on a real 2-rank torchrun job (gloo, CPU): issue 16.

One job serves the module (a torchrun start costs seconds on 2 cores): the profile first, then
the flame graph, then the user's own profiler, which stays on until the job ends.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from probe_cli.main import main
from tests.e2e.procs import require_pyspy
from tests.e2e.test_cluster import torchrun_job
from tests.support import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[dict]]]:
    tmp = tmp_path_factory.mktemp("profile")
    (tmp / "log").mkdir()
    with torchrun_job(tmp, "profile_slow_fn.py", 2, "--slow-ms", "15", "--odd-rank-ms", "25",
                      "--user-profiler-file", str(tmp / "user_profiler"),
                      "--log-dir", str(tmp / "log"),
                      env={"PROBE_TRACE": "on"}) as (_, infos):
        yield tmp, infos


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> subprocess.CompletedProcess[str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(argv), code, out, err)


def target(infos: list[dict]) -> str:
    return infos[0]["url"].removeprefix("http://")


def logged_step(tmp: Path) -> int:
    """Rank 0's last step (its log is rewritten every step: an empty read means "again")."""
    text = (tmp / "log" / "rank0.txt").read_text()
    return int(text) if text.strip().isdigit() else 0


def table(stdout: str, title: str) -> list[str]:
    """The rows of the table under the line ``title`` (header and rule skipped)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append(line)
    return rows


def test_profile_merges_every_rank_on_the_same_steps(job, capsys, tmp_path):
    tmp, infos = job
    out_path = tmp_path / "trace.json"
    # WHEN
    res = cli(capsys, "-t", target(infos), "profile", "--for", "3", "-o", str(out_path))
    # THEN one valid Chrome trace with a process per rank
    assert res.returncode == 0, res.stderr + res.stdout
    assert str(out_path) in res.stderr
    trace = json.loads(out_path.read_text())
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    # the same 3 steps on both ranks, each with operators recorded inside it
    steps = {}
    for rank in (0, 1):
        spans = sorted((e for e in events if e["pid"] == rank and e.get("ph") == "X"
                        and e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
        steps[rank] = [int(e["name"].split("#")[1]) for e in spans]
        for span in spans:
            inside = [e for e in events if e["pid"] == rank and e.get("ph") == "X"
                      and e["name"].startswith("aten::")
                      and span["ts"] <= e["ts"] <= span["ts"] + span["dur"]]
            assert inside, f"rank {rank}: no operator inside {span['name']}"
    assert steps[0] == steps[1] and len(steps[0]) == 3, steps
    assert steps[0] == list(range(steps[0][0], steps[0][0] + 3))
    # the op table names the MLP's matrix multiplications on both ranks
    rows = table(res.stdout, "top operators")
    split = rows[0].index("rank 1 operator")
    body = rows[2:]
    assert any("aten::addmm" in r[:split] for r in body), res.stdout
    assert any("aten::addmm" in r[split:] for r in body), res.stdout
    assert "step spans" in res.stdout and "profiling cost" in res.stderr
    # the tracer was paused for the window (no module rows there), and the cost was audited
    first, last = steps[0][0], steps[0][-1]
    q = cli(capsys, "-t", target(infos), "--json", "query",
            f"SELECT count(*) FROM python.torch_trace WHERE step BETWEEN {first} AND {last}")
    assert [r["rows"][0][0] for r in json.loads(q.stdout)] == [0, 0], q.stdout
    q = cli(capsys, "-t", target(infos), "--json", "query",
            "SELECT code FROM python.audit WHERE kind = 'profile' AND outcome = 'done'")
    audited = [r["rows"] for r in json.loads(q.stdout)]
    assert all(rows and "step time" in rows[-1][0] for rows in audited), q.stdout


@pytest.mark.parametrize("sampler", ["in-process", "py-spy"])
def test_flame_puts_the_slow_function_among_the_widest_frames(job, capsys, tmp_path, sampler):
    _, infos = job
    if sampler == "py-spy":
        require_pyspy()
    base = tmp_path / "flame"
    # WHEN
    res = cli(capsys, "-t", target(infos), "flame", "--seconds", "3", "--sampler", sampler,
              "-o", str(base))
    # THEN
    if sampler == "py-spy" and "py-spy failed" in res.stderr + res.stdout:
        pytest.skip(f"py-spy may not read the ranks here: {res.stderr[-300:]}")
    assert res.returncode == 0, res.stderr + res.stdout
    assert f"{sampler}, its CPU" in res.stderr, res.stderr
    widest = table(res.stdout, "widest frames")[2:7]
    assert any("slow_python_function" in r for r in widest), res.stdout
    hottest = table(res.stdout, "hottest frames")[2:5]
    assert any("slow_python_function" in r for r in hottest), res.stdout
    # only rank 1 runs odd_rank_extra_work: named as its difference from the other ranks
    diffs = table(res.stdout, "rank differences")[2:]
    assert any(r.split()[0] == "1" and "odd_rank_extra_work" in r for r in diffs), res.stdout
    folded = (tmp_path / "flame.folded").read_text()
    assert "rank 0;" in folded and "rank 1;" in folded
    assert "probe_agent" not in folded  # the agent's own frames are hidden
    speedscope = json.loads((tmp_path / "flame.speedscope.json").read_text())
    assert [p["name"] for p in speedscope["profiles"]] == ["rank 0", "rank 1"]
    assert (tmp_path / "flame.svg").read_text().startswith("<svg")
    assert "slow_python_function" in (tmp_path / "flame.html").read_text()


def test_profile_refused_while_the_programs_own_profiler_runs(job, capsys, tmp_path):
    tmp, infos = job
    # GIVEN each rank running its own torch.profiler
    (tmp / "user_profiler").touch()
    wait_until(lambda: all((tmp / f"user_profiler_rank{r}").exists() for r in (0, 1)), 60,
               "the program's own profiler did not start")
    before = wait_until(lambda: logged_step(tmp), 10, "no step logged")
    # WHEN
    res = cli(capsys, "-t", target(infos), "profile", "--for", "3", "-o",
              str(tmp_path / "t.json"))
    # THEN refused with the reason, nothing written, and training goes on
    assert res.returncode != 0, res.stdout
    assert "torch.profiler session is already active" in res.stderr, res.stderr
    assert not (tmp_path / "t.json").exists()
    wait_until(lambda: logged_step(tmp) > before + 3, 60,
               "training stopped after the refusal")


def test_ceilings_refuse_with_the_flag_to_raise_them(capsys):
    res = cli(capsys, "-t", "127.0.0.1:1", "profile", "--for", "50")
    assert res.returncode == 2 and "--max-steps 50" in res.stderr, res.stderr
    res = cli(capsys, "-t", "127.0.0.1:1", "flame", "--seconds", "120")
    assert res.returncode == 2 and "--max-seconds 120" in res.stderr, res.stderr
