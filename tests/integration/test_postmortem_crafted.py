"""A post-mortem copy is files someone may have packed: reading one must not run its SQL, reach
other files, print its escapes raw, or hang on what it holds (transport/copy_db.py,
transport/postmortem.py). Real DuckDB, real Parquet, the real CLI in this process."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from probe_cli.main import main
from tests.foreign import FOREIGN_UID, need_root, run_as

ESC = "\x1b]0;pwned\x07\x1b[2J"


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _copy(base: Path, job: str = "j", **records: object) -> Path:
    """A job's copy as the owner would have it: 0700 directories, a steps part, records."""
    rank = base / job / "rank-0"
    rank.mkdir(parents=True, mode=0o700)
    for d in (base, base / job, rank):
        d.chmod(0o700)
    pq.write_table(pa.table({"step": [1, 2], "duration": [0.1, 0.2], "note": ["ok", ESC]}),
                   rank / "steps.1.parquet")
    meta = {"job": job, "rank": 0, "world_size": 1, "refreshed_at": time.time(), "every_s": 10}
    for name, rec in {"meta": meta, **records}.items():
        if isinstance(rec, (dict, list)):
            (rank / f"{name}.json").write_text(json.dumps(rec))
    return base / job


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM glob('/etc/*')",
    "COPY (SELECT 42) TO 'copied.csv'",
    "ATTACH 'attached.db' AS a",
    "INSTALL httpfs",
    "SET threads = 1",
    "CREATE TABLE t AS SELECT 1",
])
def test_query_on_a_copy_is_read_only_and_sandboxed(sql, capsys, tmp_path, monkeypatch):
    job = _copy(tmp_path / "pm")
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli(capsys, "-t", str(job), "query", sql)
    assert code != 0 and "root:" not in out, (out, err)
    assert not (tmp_path / "copied.csv").exists() and not (tmp_path / "attached.db").exists()
    code, out, _ = _cli(capsys, "-t", str(job), "--json", "query", "SELECT count(*) FROM steps")
    assert code == 0 and json.loads(out)[0]["rows"] == [[2]], out


@pytest.mark.parametrize("argv", [("trace",), ("eval", "1"), ("actions",), ("memory",
                                                                              "--tensors")])
def test_a_live_only_command_on_a_copy_fails_that_rank_saying_why(argv, capsys, tmp_path):
    # GIVEN a copy; WHEN a command that needs a live rank is pointed at it
    job = _copy(tmp_path / "pm")
    code, out, err = _cli(capsys, "-t", str(job), *argv)
    # THEN its rank fails with the method that needs a live rank (rank_client.live), nothing
    # raises past the fan-out
    assert code != 0 and "needs a live rank; this is a post-mortem copy" in out + err, \
        (out, err)


def test_table_names_from_file_names_are_data(capsys, tmp_path, monkeypatch):
    job = _copy(tmp_path / "pm")
    evil = """x" AS SELECT 1; COPY (SELECT 42) TO 'pwned.csv'; CREATE VIEW "y.1.parquet"""
    shutil.copy(job / "rank-0" / "steps.1.parquet", job / "rank-0" / evil)
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli(capsys, "-t", str(job), "--json", "query",
                          "SELECT count(*) FROM steps")
    assert code == 0 and json.loads(out)[0]["rows"] == [[2]], (out, err)
    assert not (tmp_path / "pwned.csv").exists()
    code, out, err = _cli(capsys, "postmortem", str(tmp_path / "pm"))
    assert "is not a table name: left out" in out, out
    assert not (tmp_path / "pwned.csv").exists()


def test_text_from_a_copy_is_escaped(capsys, tmp_path):
    job = _copy(tmp_path / "pm", end={"kind": "exception", "at": time.time(),
                                      "exception": f"ValueError: {ESC}", "traceback": [
                                          {"func": ESC, "file": "t.py", "lineno": 1}]})
    code, out, err = _cli(capsys, "postmortem", str(tmp_path / "pm"))
    assert "ValueError: \\x1b]0;pwned\\x07" in out, out
    code2, out2, err2 = _cli(capsys, "-t", str(job), "query", "SELECT note FROM steps")
    for text in (out, err, out2, err2):
        assert "\x1b" not in text and "\x07" not in text, text
    assert "\\x1b[2J" in out2


def _plant(root: str, name: str) -> bool:
    os.mkdir(os.path.join(root, name), 0o755)
    os.mkdir(os.path.join(root, name, "rank-0"), 0o755)
    return True


@pytest.fixture
def shared() -> Iterator[Path]:
    d = Path(f"/tmp/probe-pm-shared-{uuid.uuid4().hex[:8]}")
    d.mkdir()
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_planted_directory_name_is_escaped(capsys, shared):
    need_root()
    run_as(FOREIGN_UID, _plant, str(shared), f"job{ESC}")
    code, out, err = _cli(capsys, "postmortem", str(shared))
    assert "\x1b" not in out + err and "\x07" not in out + err, out + err
    assert "job\\x1b]0;pwned" in err and f"uid {FOREIGN_UID}" in err


@pytest.mark.timeout(60)
def test_a_crafted_copy_gives_a_line_not_a_hang_or_crash(capsys, tmp_path):
    job = _copy(tmp_path / "pm", end=json.loads("[" * 50 + "]" * 50))
    rank = job / "rank-0"
    (rank / "death.json").write_text("[" * 200000 + "]" * 200000)  # nested past recursion
    meta = json.loads((rank / "meta.json").read_text())
    (rank / "meta.json").write_text(json.dumps({**meta, "world_size": 10**18}))
    (rank / "metrics.2.parquet").write_bytes(b"")  # a zero-length part
    other = _copy(tmp_path / "pm", job="fifo")
    (other / "rank-0" / "meta.json").unlink()
    os.mkfifo(other / "rank-0" / "meta.json")
    t0 = time.monotonic()
    code, out, err = _cli(capsys, "postmortem", str(tmp_path / "pm"))
    assert time.monotonic() - t0 < 30
    text = out + err
    assert "world_size 1000000000000000000 is not believed" in text, text
    assert "death.json is not valid JSON (RecursionError)" in text, text
    assert "meta.json is not a regular file" in text, text
    assert "metrics.2.parquet is not a whole Parquet file" in text, text
    code, out, err = _cli(capsys, "-t", str(job), "--json", "query", "SELECT count(*) FROM steps")
    assert code == 0, err


def test_postmortem_lists_a_running_job_as_running(capsys, tmp_path):
    job = _copy(tmp_path / "pm")
    meta = json.loads((job / "rank-0" / "meta.json").read_text())
    (job / "rank-0" / "meta.json").write_text(json.dumps({
        **meta, "pid": os.getpid(), "host": socket.gethostname(),
        "started_at": time.time() + 5}))  # this process started before it: not a reused pid
    code, out, err = _cli(capsys, "postmortem", str(tmp_path / "pm"))
    assert f"rank 0: running (pid {os.getpid()}), not ended" in out, out
    assert "killed (no trace)" not in out
    (job / "rank-0" / "meta.json").write_text(json.dumps({  # a node of a shared filesystem
        **meta, "pid": 1, "host": "another-node", "refreshed_at": time.time() - 3}))
    code, out, err = _cli(capsys, "postmortem", str(tmp_path / "pm"))
    assert "rank 0: no end recorded; its copy was refreshed 3 s ago on another-node" in out, out


def test_postmortem_does_not_ask_which_live_job(capsys, tmp_path, monkeypatch):
    """Two live jobs' agents in the run dir: `probe postmortem` reads copies, it needs none."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    socks = []
    try:
        for p in sleepers:
            s = socket.socket(socket.AF_UNIX)
            s.bind(str(run_dir / f"{p.pid}.sock"))
            s.listen(1)
            socks.append(s)
            (run_dir / f"{p.pid}.json").write_text(json.dumps({"rank": 0}))
        _copy(tmp_path / "pm")
        monkeypatch.setenv("PROBE_RUN_DIR", str(run_dir))
        code, out, err = _cli(capsys, "postmortem", str(tmp_path / "pm"))
        assert code == 0 and "say which one with -t" not in err, err
        assert "ranks 0 of 1" in out, out
    finally:
        for s in socks:
            s.close()
        for p in sleepers:
            p.kill()
            p.wait()
