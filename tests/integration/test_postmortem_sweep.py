"""The post-mortem sweep deletes only copies it can prove are its own, under a root nobody else
controls (probe_protocol/owned_tree.py): a careless PROBE_POSTMORTEM_DIR costs the owner
nothing, and a root planted by uid 65534 is refused, for the copy too."""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from probe_agent.postmortem import Postmortem
from probe_agent.postmortem.sweep import sweep
from probe_protocol import owned_tree
from probe_protocol import postmortem as layout
from tests.foreign import FOREIGN_UID, need_root, run_as

OLD = time.time() - 30 * 24 * 3600


def _age(path: Path, when: float = OLD) -> None:
    for base, dirs, files in os.walk(path):
        for n in files + dirs:
            os.utime(os.path.join(base, n), (when, when), follow_symlinks=False)
    os.utime(path, (when, when))


def _copy(root: Path, job: str, rank: int = 0, old: bool = True) -> Path:
    """A copy as the agent writes it: the job directory (marked), a rank's, a part, meta."""
    rank_dir = Path(layout.rank_dir(str(root), job, rank))
    owned_tree.make_copy_dir(str(rank_dir))
    (rank_dir / "steps.1.parquet").write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    layout.write_json(str(rank_dir / layout.META), {"job": job})
    if old:
        _age(rank_dir.parent)
    return rank_dir.parent


def _owner_files(home: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for base, _, files in os.walk(home):
        for n in files:
            st = os.lstat(os.path.join(base, n))
            out[os.path.relpath(os.path.join(base, n), home)] = (st.st_ino, st.st_size,
                                                                 st.st_mtime_ns)
    return out


@pytest.fixture
def shared() -> Iterator[Path]:
    """A sticky, world-writable directory, like /tmp or a team scratch directory."""
    d = Path(f"/tmp/probe-sweep-{uuid.uuid4().hex[:8]}")
    d.mkdir()
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_careless_root_loses_nothing_but_proven_old_copies(tmp_path: Path):
    home = tmp_path / "runs"  # PROBE_POSTMORTEM_DIR=$HOME/runs
    (home / "project-2019").mkdir(parents=True)
    (home / "project-2019" / "train.py").write_text("the owner's code\n")
    _age(home / "project-2019")
    (home / "today").mkdir()
    with open(home / "today" / "ckpt.pt", "wb") as f:  # sparse: 8 GiB apparent, ~0 on disk
        f.truncate(8 << 30)
    old = _copy(home, "oldjob")
    # An old copy the owner put a file of their own in: not provably a copy any more.
    mixed = _copy(home, "mixed")
    (mixed / "rank-0" / "notes.txt").write_text("the owner's notes\n")
    _age(mixed)
    before = _owner_files(home / "project-2019") | _owner_files(home / "today")

    removed = sweep(str(home), keep="current")

    assert removed == [str(old)]
    assert not old.exists()
    assert (mixed / "rank-0" / "notes.txt").read_text() == "the owner's notes\n"
    assert (_owner_files(home / "project-2019") | _owner_files(home / "today")) == before


def test_size_is_counted_on_disk_not_apparent(tmp_path: Path):
    root = tmp_path / "pm"
    job = _copy(root, "recent", old=False)
    with open(job / "rank-0" / "torch_trace.2.parquet", "wb") as f:
        f.truncate(8 << 30)  # a sparse part: 8 GiB apparent, past the 4 GiB total
    assert sweep(str(root), keep="current") == []
    assert job.exists()


def test_links_inside_a_copy_are_never_followed(tmp_path: Path):
    root, victim = tmp_path / "pm", tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep\n")
    job = _copy(root, "linked")
    os.symlink(victim / "keep.txt", job / "rank-0" / "steps.7.parquet")
    os.symlink(victim, job / "rank-1")
    _age(job)
    assert sweep(str(root), keep="current") == []
    assert (victim / "keep.txt").read_text() == "keep\n"


def test_a_clean_exit_removes_only_a_proven_rank_copy(tmp_path: Path):
    root = tmp_path / "pm"
    job = _copy(root, "j", old=False)
    assert owned_tree.remove_rank_copy(str(job / "rank-0"))
    assert not job.exists()  # the last rank gone: the job's directory too
    plain = tmp_path / "plain" / "rank-0"  # not made by the copy: no marker above it
    plain.mkdir(parents=True)
    (plain / "meta.json").write_text("{}")
    assert not owned_tree.remove_rank_copy(str(plain))
    assert (plain / "meta.json").exists()


def _plant_link(at: str, to: str) -> bool:
    os.symlink(to, at)
    return True


def _plant_dir(at: str) -> bool:
    os.mkdir(at, 0o777)
    os.chmod(at, 0o777)
    return True


def test_a_root_planted_as_a_link_by_another_uid_is_refused(shared: Path, tmp_path: Path,
                                                             store, caplog):
    need_root()
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    (home / "project" / "train.py").write_text("the owner's code\n")
    _age(home)
    _copy(home, "oldjob")  # even a real old copy there is not swept through the link
    before = sorted(os.listdir(home))
    root = shared / "postmortem"
    run_as(FOREIGN_UID, _plant_link, str(root), str(home))

    pm = Postmortem(store, root=str(root), job="now", rank=0, run_dir=None, pid=os.getpid(),
                    every_s=3600, budget_mb=1, keep=False, meta=dict)
    with caplog.at_level(logging.WARNING):
        pm.start()
    try:
        assert sorted(os.listdir(home)) == before  # nothing deleted, nothing written
        assert (home / "project" / "train.py").read_text() == "the owner's code\n"
        warned = [r.getMessage() for r in caplog.records if "post-mortem" in r.getMessage()]
        assert len(warned) == 1 and "\n" not in warned[0], warned
        assert f"PROBE_POSTMORTEM_DIR={root}" in warned[0]
        assert f"symlink owned by uid {FOREIGN_UID}" in warned[0]
    finally:
        pm.close(exiting=False, watchdog_stays=False)
        pm.release()


def test_a_run_dir_made_by_another_uid_is_refused(shared: Path, tmp_path: Path):
    """/tmp/probe-<uid>/postmortem when the run dir check is skipped: another uid made it."""
    need_root()
    run_dir = shared / f"probe-{os.getuid()}"
    run_as(FOREIGN_UID, _plant_dir, str(run_dir))
    with pytest.raises(owned_tree.UntrustedPathError, match=f"owned by uid {FOREIGN_UID}"):
        owned_tree.make_copy_dir(str(run_dir / "postmortem" / "job" / "rank-0"))
    assert os.listdir(run_dir) == []
    with pytest.raises(owned_tree.UntrustedPathError):
        sweep(str(run_dir / "postmortem"), keep="x")


def test_a_shared_sticky_root_keeps_working(shared: Path):
    job = _copy(shared / "pm", "j", old=False)
    assert (job / layout.MARKER).exists()
    assert oct(job.stat().st_mode & 0o777) == "0o700"
    _copy(shared, "j2", old=False)  # the sticky directory itself as the root
    assert sweep(str(shared), keep="x") == []


def test_ranks_move_into_the_agreed_run_name(tmp_path: Path):
    root = tmp_path / "pm"
    r0 = _copy(root, "addr-29500-launcherA", rank=0, old=False) / "rank-0"
    r1 = Path(layout.rank_dir(str(root), "addr-29500-launcherA", 1))
    owned_tree.make_copy_dir(str(r1))
    for i, rank in enumerate((r0, r1)):
        owned_tree.move_rank_copy(str(rank), layout.rank_dir(str(root), "addr-29500-won", i))
    assert sorted(os.listdir(root)) == ["addr-29500-won"]  # the old name went with its last rank
    won = root / "addr-29500-won"
    assert sorted(os.listdir(won)) == [layout.MARKER, "rank-0", "rank-1"]
    assert (won / "rank-0" / "steps.1.parquet").exists()
