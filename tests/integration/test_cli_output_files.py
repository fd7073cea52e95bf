"""Files the CLI writes are never written through a planted symlink, nor over a file without
--overwrite (probe_cli/output_files.py).

The planter is a real process of uid 65534 (tests/foreign.py) working in a directory every user
may write to (0777, not sticky: the kernel's protected_symlinks guards only sticky ones). Before,
`probe flame -o` overwrote the file another user's symlink pointed at, and `profile -o` wrote
its ``*.part`` files the same way.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from probe_cli.export.trace_merge import RankTrace, merge_traces
from probe_cli.main import main
from tests.foreign import FOREIGN_UID, need_root, run_as
from tests.unit.test_trace_merge import kineto_trace

pytest.importorskip("duckdb")
PRECIOUS = "the owner's file\n"


def _plant(links: list[list[str]]) -> int:
    for name, to in links:
        os.symlink(to, name)
    return len(links)


@pytest.fixture
def shared(tmp_path) -> Iterator[tuple[Path, Path]]:
    """(a directory every user may write to, a file of the owner's outside it)."""
    need_root()
    d = Path(f"/tmp/probe-shared-{uuid.uuid4().hex[:8]}")
    d.mkdir()
    d.chmod(0o777)
    victim = tmp_path / "victim"
    victim.write_text(PRECIOUS)
    try:
        yield d, victim
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_planted_output_symlink_is_refused(make_agent, shared, capsys):
    d, victim = shared
    agent = make_agent()
    target = agent.url.removeprefix("http://")
    # GIVEN uid 65534 planted the names the owner will write: links to the owner's file, and
    # one dangling link
    names = {"query": d / "out.csv", "flame": d / "flame.svg", "profile": d / "prof.json",
             "dangling": d / "new.csv"}
    links = [[str(p), str(victim)] for k, p in names.items() if k != "dangling"]
    links.append([str(names["dangling"]), str(d / "created-by-the-owner")])
    assert run_as(FOREIGN_UID, _plant, links) == 4
    # WHEN the owner writes to them
    runs = {
        "query": main([target, "query", "SELECT 1 AS one", "--format", "csv",
                       "-o", str(names["query"])]),
        "flame": main([target, "flame", "--seconds", "1", "-o", str(d / "flame")]),
        "profile": main([target, "profile", "--for", "1", "-o", str(names["profile"])]),
        "dangling": main([target, "query", "SELECT 1", "--format", "csv",
                          "-o", str(names["dangling"])]),
    }
    err = capsys.readouterr().err
    # THEN each is refused before any work, and the owner's file is untouched
    assert runs == {k: 2 for k in runs}, err
    assert err.count("exists (a symlink); not writing over it") == 4, err
    assert victim.read_text() == PRECIOUS
    assert not (d / "created-by-the-owner").exists()
    # AND with --overwrite the link itself is replaced by the owner's file, never followed
    assert main([target, "query", "SELECT 1 AS one", "--format", "csv", "-o",
                 str(names["query"]), "--overwrite"]) == 0
    assert not names["query"].is_symlink()
    assert names["query"].read_text().splitlines() == ["rank,one", "0,1"]
    assert names["query"].stat().st_uid == os.getuid()
    assert victim.read_text() == PRECIOUS


def test_an_existing_file_is_refused_without_overwrite(make_agent, tmp_path, capsys):
    agent = make_agent()
    out = tmp_path / "result.parquet"
    out.write_text(PRECIOUS)
    argv = [agent.url.removeprefix("http://"), "query", "SELECT 1 AS one", "--format",
            "parquet", "-o", str(out)]
    assert main(argv) == 2
    assert "exists (a file)" in capsys.readouterr().err and out.read_text() == PRECIOUS
    assert main([*argv, "--overwrite"]) == 0
    assert out.read_bytes()[:4] == b"PAR1"
    assert [p.name for p in tmp_path.iterdir()] == ["result.parquet"]  # no temp left behind


def test_profile_merge_writes_no_part_file_through_a_planted_link(shared):
    """The merge's scratch files (``*.part``) live in a fresh private directory: links planted
    at the names it used to write beside -o are never followed."""
    d, victim = shared
    kineto_trace(d / "r0.json", pid=100, start_us=5_000_000.0)
    out = d / "merged.json"
    links = [[f"{out}.rank0.part", str(victim)], [f"{out}.part", str(victim)]]
    run_as(FOREIGN_UID, _plant, links)
    # WHEN the merge writes the profile
    merge_traces([RankTrace(0, str(d / "r0.json"), pid=100, window_start=1.0)], str(out))
    # THEN the owner's file is untouched, and the merged trace is a file of its own
    assert victim.read_text() == PRECIOUS
    assert out.is_file() and not out.is_symlink() and out.read_text().startswith("{")
