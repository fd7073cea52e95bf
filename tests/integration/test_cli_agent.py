"""The CLI against the real agent (tests/conftest.py ``agent`` fixture: uvicorn on 127.0.0.1:0).

These pin the wire contract of docs/http-api.md from the client's side: the JSON routes, the
Arrow stream (``--format arrow|parquet``, ``--gather``) and the unix socket (``probe PID``).
They belong with the integration tests; they live here because this file's owner owns only
tests/unit/test_cli_*.py.
"""

from __future__ import annotations

import io
import json
import os

import pytest

from probe_cli.main import main

pytest.importorskip("duckdb")
pa = pytest.importorskip("pyarrow")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def address(agent) -> str:
    return agent.url.removeprefix("http://")


def test_info_backtrace_eval_over_tcp(agent, capsys):
    code, out, err = run(capsys, address(agent), "info")
    assert code == 0, err
    assert str(os.getpid()) in out

    code, out, err = run(capsys, address(agent), "backtrace")
    assert code == 0, err
    assert out.startswith("Rank 0 (") and "Thread " in out and "[main]" in out
    assert "test_info_backtrace_eval_over_tcp" in out

    code, out, err = run(capsys, address(agent), "--json", "eval", "print('hi'); 6*7")
    assert code == 0, err
    [body] = json.loads(out)
    assert body["result"] == "42" and body["stdout"] == "hi\n"


def test_eval_dash_reads_the_code_from_stdin(agent, capsys, monkeypatch):
    # GIVEN code on stdin (click 8.5's get_text_stream, used here before, warns: deprecated)
    monkeypatch.setattr("sys.stdin", io.StringIO("x = 6\nx * 7\n"))
    # WHEN `probe eval -` runs it
    code, out, err = run(capsys, address(agent), "eval", "-")
    # THEN the agent ran what stdin held
    assert code == 0, err
    assert out == "42\n"


def test_pid_endpoint_over_the_unix_socket(agent, run_dir, capsys):
    code, out, err = run(capsys, "--run-dir", run_dir, str(os.getpid()), "eval", "1+1")
    assert code == 0, err
    assert out == "2\n"


def test_bad_sql_shows_the_agents_parser_error(agent, capsys):
    code, out, err = run(capsys, address(agent), "query", "SELCT 1")
    assert code == 1 and out == ""
    assert "HTTP 400" in err and "SELCT" in err


def test_query_table(agent, capsys):
    code, out, err = run(capsys, address(agent), "query", "SELECT 41 + 1 AS answer")
    assert code == 0, err
    assert out.splitlines()[0] == "answer" and out.splitlines()[2].strip() == "42"


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_query_to_arrow_and_parquet_files_with_rank_column(agent, capsys, tmp_path, fmt):
    # GIVEN a file path for the merged result
    target = tmp_path / f"out.{fmt}"
    # WHEN the query is written as Arrow IPC / Parquet
    code, out, err = run(capsys, address(agent), "query", "SELECT 1 AS a, 'x' AS b",
                         "--format", fmt, "-o", str(target))
    # THEN the file holds the rows with a leading rank column
    assert code == 0, err
    assert out == "" and f"wrote 1 rows from rank 0 to {target}" in err
    if fmt == "arrow":
        table = pa.ipc.open_file(str(target)).read_all()
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(str(target))
    assert table.column_names == ["rank", "a", "b"]
    assert table.to_pylist() == [{"rank": 0, "a": 1, "b": "x"}]


def test_gather_runs_local_sql_over_every_ranks_rows(agent, capsys):
    code, out, err = run(capsys, address(agent), "--json", "query",
                         "SELECT * FROM range(5) t(i)", "--gather",
                         "SELECT count(*) AS n, sum(i) AS total, min(rank) AS r FROM results")
    assert code == 0, err
    body = json.loads(out)
    assert body["columns"] == ["n", "total", "r"]
    assert body["rows"] == [[5, 10, 0]] and body["ranks"] == [0]


def test_wrong_token_against_the_real_agent(make_agent, capsys):
    agent = make_agent(token="s3cret")
    code, _, err = run(capsys, address(agent), "--token", "nope", "info")
    assert code == 1 and "HTTP 401" in err and "PROBE_TOKEN" in err
    code, _, err = run(capsys, address(agent), "--token", "s3cret", "info")
    assert code == 0, err


def test_ctrl_c_during_a_long_eval_ends_the_cli_at_once(agent, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from tests.support import python_env, wait_until

    # GIVEN `probe eval` running code that goes on until the test releases it (at most 60 s)
    started, release, done = tmp_path / "started", tmp_path / "release", tmp_path / "done"
    code = (f"import os, time\nopen({str(started)!r}, 'w').close()\n"
            "deadline = time.monotonic() + 60\n"
            f"while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:\n"
            "    time.sleep(0.05)\n"
            f"open({str(done)!r}, 'w').close()")
    proc = subprocess.Popen([sys.executable, "-m", "probe_cli", "-t", address(agent),
                             "--timeout", "60", "eval", code], env=python_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(started.exists, 60, "the eval never started on the rank")
        # WHEN the operator presses Ctrl-C
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        waited = time.monotonic() - t0
        # THEN the CLI is gone while the eval still runs, and says the eval goes on
        assert not done.exists() and waited < 12, f"Ctrl-C took {waited:.1f} s"
        assert proc.returncode == 1 and "interrupted" in err and "keeps running" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        release.touch()
    # AND the eval did go on: released, it runs to its end (before teardown)
    wait_until(done.exists, 60, "the eval did not finish on the rank")


def test_an_eval_the_cli_stopped_waiting_for_is_named_by_its_id(agent, capsys):
    import re

    # GIVEN an eval that outlasts the CLI's --timeout (the agent's own limit is longer)
    code, _, err = run(capsys, address(agent), "--timeout", "0.5", "eval",
                       "import time\nfor _ in range(600): time.sleep(0.05)")
    # THEN the CLI names the eval's id and how to stop it
    m = re.search(r"eval ([0-9a-f]{8}) may still be running", err)
    assert code == 1 and m and f"probe eval --cancel {m.group(1)}" in err, err
    # AND that id is the one the agent runs it under: cancelling it by that id stops it
    code, out, err = run(capsys, address(agent), "eval", "--cancel", m.group(1))
    assert code == 0, err
