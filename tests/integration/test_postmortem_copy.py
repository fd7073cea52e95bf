"""The post-mortem copy against a real Store: incremental parts, the budget, and the CLI's reading
of what it left (a real local DuckDB over the Parquet files)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pyarrow as pa

from probe_agent.postmortem.copy import PostmortemCopy
from probe_cli.diagnose.ends import missing_lines
from probe_cli.transport.postmortem import PostmortemClient, find_job
from probe_protocol import postmortem as layout
from probe_protocol.query import QueryBody


def _metrics(store, first: int, n: int) -> None:
    schema = store.arrow_schema("python.metrics")
    store.append("python.metrics", pa.table({
        "timestamp": [float(i) for i in range(first, first + n)], "rank": [0] * n,
        "step": list(range(first, first + n)), "name": ["loss"] * n,
        "value": [1.0 / (i + 1) for i in range(first, first + n)]}, schema=schema))


def _copy(store, path: Path, budget: int) -> PostmortemCopy:
    return PostmortemCopy(store, str(path), lambda: {"job": "j", "rank": 0, "world_size": 2},
                          every_s=10.0, budget_bytes=budget)


def test_refreshes_copy_only_new_rows_and_the_cli_reads_them(store, tmp_path: Path):
    rank_dir = tmp_path / "root" / "j" / "rank-0"
    copy = _copy(store, rank_dir, 1 << 30)
    _metrics(store, 0, 100)
    copy.refresh()
    first = layout.table_files(str(rank_dir))["metrics"]
    _metrics(store, 100, 50)
    copy.refresh()
    parts = layout.table_files(str(rank_dir))["metrics"]
    assert parts[:len(first)] == first and len(parts) == len(first) + 1  # one new part
    import pyarrow.parquet as pq

    assert pq.read_table(parts[-1]).num_rows == 50  # only the rows appended since
    copy.refresh()  # nothing new: no new part
    assert layout.table_files(str(rank_dir))["metrics"] == parts
    for p in [rank_dir, *rank_dir.iterdir()]:
        assert stat.S_IMODE(p.stat().st_mode) == (0o700 if p.is_dir() else 0o600)

    job = find_job(str(tmp_path / "root" / "j"))
    client = PostmortemClient(job.ranks[0])
    try:
        body = QueryBody.from_wire(client.query(
            "SELECT count(*) AS n, max(step) AS last FROM metrics"))
    finally:
        client.close()
    assert body.records() == [{"n": 150, "last": 149}]
    # Rank 1 never wrote a directory: the CLI says so.
    assert any("rank(s) 1 left no directory" in line for line in missing_lines(job))


def test_past_the_budget_the_oldest_parts_go_and_the_copy_says_so(store, tmp_path: Path):
    rank_dir = tmp_path / "j" / "rank-0"
    copy = _copy(store, rank_dir, 1 << 30)
    for i in range(4):
        _metrics(store, i * 2000, 2000)
        copy.refresh()
    parts = layout.table_files(str(rank_dir))["metrics"]
    assert len(parts) == 4
    total = sum(os.path.getsize(p) for ps in layout.table_files(str(rank_dir)).values()
                for p in ps)
    copy.budget_bytes = total - os.path.getsize(parts[0]) // 2  # one part too many
    _metrics(store, 8000, 10)
    copy.refresh()
    left = layout.table_files(str(rank_dir))["metrics"]
    assert parts[0] not in left and left[-1] not in parts  # oldest gone, newest kept
    job = find_job(str(tmp_path / "j"))
    assert job.ranks[0].meta["truncated"] is True
    assert any("hit its budget" in line for line in missing_lines(job))


def test_a_full_disk_loses_no_rows_and_leaves_no_temporaries(store, full_disk: Path):
    from tests.fullfs import fill

    rank_dir = full_disk / "root" / "j" / "rank-0"
    copy = _copy(store, rank_dir, 1 << 30)
    _metrics(store, 0, 100)
    copy.refresh()
    before = {p.name: p.read_bytes() for p in rank_dir.iterdir()}
    whole = [n for n in before if n.startswith(("backtrace.", "collectives."))]
    assert whole, before  # tables copied whole are there to lose

    fill(full_disk, leave=0)
    _metrics(store, 100, 5000)
    copy.refresh()  # ENOSPC: logged once, never raised
    assert copy.failing_since is not None
    left = {p.name: p.read_bytes() for p in rank_dir.iterdir()}
    assert not [n for n in left if n.endswith(".tmp")], left
    for name in [*whole, *(n for n in before if n.startswith("metrics."))]:
        assert left.get(name) == before[name], name  # every earlier part kept, whole

    (full_disk / "hog").unlink()
    copy.refresh()
    assert copy.failing_since is None
    job = find_job(str(full_disk / "root" / "j"))
    client = PostmortemClient(job.ranks[0])
    try:
        body = QueryBody.from_wire(client.query("SELECT count(*) AS n FROM metrics"))
    finally:
        client.close()
    assert body.records() == [{"n": 5100}]  # the rows of the failed refresh were not lost
    assert not [p for p in rank_dir.iterdir() if p.name.endswith(".tmp")]


def test_a_zero_length_part_does_not_break_the_copy(store, tmp_path: Path):
    rank_dir = tmp_path / "j" / "rank-0"
    copy = _copy(store, rank_dir, 1 << 30)
    _metrics(store, 0, 10)
    copy.refresh()
    (rank_dir / "metrics.999.parquet").write_bytes(b"")
    (rank_dir / "steps.998.parquet").write_bytes(b"PAR1garbage")
    job = find_job(str(tmp_path / "j"))
    client = PostmortemClient(job.ranks[0])
    try:
        body = QueryBody.from_wire(client.query("SELECT count(*) AS n FROM metrics"))
    finally:
        client.close()
    assert body.records() == [{"n": 10}]
    lines = missing_lines(job)
    assert any("metrics.999.parquet is not a whole Parquet file" in ln for ln in lines), lines


def test_rows_trimmed_before_a_refresh_are_counted_not_hidden(store, tmp_path: Path):
    """The store's retention (1 MB here) trims rows a slow or failing copy never saw: the copy
    says how many, and that it is truncated, instead of truncated: false."""
    import pyarrow.parquet as pq

    from tests.support import wait_until

    rank_dir = tmp_path / "j" / "rank-0"
    copy = _copy(store, rank_dir, 1 << 30)
    _metrics(store, 0, 100)
    copy.refresh()
    for first in range(100, 60100, 20000):
        _metrics(store, first, 20000)
    store.flush(10)
    wait_until(lambda: store.query("SELECT min(step) FROM python.metrics").rows[0][0] > 100,
               60, "the store's retention never trimmed the metrics")
    copy.refresh()  # one refresh after the trim: the rows it never saw are gone
    copied = sum(pq.read_table(p).num_rows for p in layout.table_files(str(rank_dir))["metrics"])
    job = find_job(str(tmp_path / "j"))
    meta = job.ranks[0].meta
    assert meta["lost_rows"] > 0 and meta["truncated"] is True, meta
    assert copied + meta["lost_rows"] == 60100, (copied, meta["lost_rows"])
    assert any("trimmed by the agent's retention" in line for line in missing_lines(job))


def test_the_collectives_are_copied_first(store, tmp_path: Path):
    """The final refresh races the launcher's SIGTERM (torchrun kills the survivors when one
    rank dies): at load 9 a survivor's copy ended before its collectives table, and the
    post-mortem mismatch verdict had one side of the collective. They now go first."""
    rank_dir = tmp_path / "root" / "j" / "rank-0"
    _metrics(store, 0, 10)
    _copy(store, rank_dir, 1 << 30).refresh()
    files = layout.table_files(str(rank_dir))

    def seq(path: str) -> int:
        return int(os.path.basename(path).split(".")[1])

    first = min((seq(p), short) for short, paths in files.items() for p in paths)
    assert first[1] == "collectives", sorted(files)
