"""probe_agent/rundir.py: a run dir that cannot be used falls back with the reason; dead
processes' files are swept (issue 20, item 5). Real directories, a real tmpfs, real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from probe_agent import rundir
from tests.support import wait_until


def test_a_usable_dir_is_kept_and_made_private(tmp_path: Path):
    d = tmp_path / "run"
    d.mkdir(mode=0o755)
    assert rundir.choose(str(d)) == (str(d), None)
    assert d.stat().st_mode & 0o777 == 0o700


def test_ranks_that_make_the_dir_at_once_all_keep_it(tmp_path: Path):
    # The ranks of one job start together; the loser of the mkdir race once fell back (CI).
    import threading
    for i in range(20):
        d, barrier, got = tmp_path / f"run{i}", threading.Barrier(8), []

        def choose() -> None:
            barrier.wait()
            got.append(rundir.choose(str(d)))

        threads = [threading.Thread(target=choose) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == [(str(d), None)] * 8


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_a_symlink_or_a_file_is_never_used(tmp_path: Path, kind: str):
    d = tmp_path / "run"
    if kind == "symlink":
        (tmp_path / "elsewhere").mkdir()
        d.symlink_to(tmp_path / "elsewhere")
    else:
        d.write_text("")
    path, warning = rundir.choose(str(d))
    try:
        assert path != str(d) and "is not a directory" in warning
        assert Path(path).stat().st_uid == os.getuid()
    finally:
        os.rmdir(path)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``mount(options)``: a directory on a tmpfs of its own with those mount options."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.stdout}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize(("options", "reason"), [
    ("size=64k,nr_inodes=2", "No space left on device"),  # out of inodes
    ("size=64k,ro", "Read-only file system"),
], ids=["no-inodes", "read-only"])
def test_a_full_or_read_only_filesystem_falls_back(small_fs, options: str, reason: str):
    where = small_fs(options)
    if "ro" not in options.split(","):
        (where / "taken").mkdir()  # the root and this use up both inodes
    path, warning = rundir.choose(str(where / "run"))
    try:
        assert path != str(where / "run") and reason in warning, warning
    finally:
        os.rmdir(path)


def test_sweep_removes_only_dead_processes_files(tmp_path: Path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for suffix in (".sock", ".json", ".watchdog.log", ".exit.json"):
        (tmp_path / f"{dead.pid}{suffix}").write_text("")
    (tmp_path / f"{os.getpid()}.json").write_text("")  # a live one
    (tmp_path / "job-1.token").write_text("")  # not a pid's file
    removed = rundir.sweep(str(tmp_path))
    assert sorted(removed) == sorted(f"{dead.pid}{s}" for s in
                                     (".sock", ".json", ".watchdog.log", ".exit.json"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{os.getpid()}.json", "job-1.token"])


def test_sweep_treats_a_reused_pid_as_dead(tmp_path: Path):
    """Files older than the process that now has their pid belong to its predecessor."""
    f = tmp_path / f"{os.getpid()}.sock"
    f.write_text("")
    os.utime(f, (1_000_000, 1_000_000))  # written in 1970: before this process started
    assert rundir.sweep(str(tmp_path)) == [f.name]


def test_sweep_treats_an_unreaped_zombie_as_dead(tmp_path: Path):
    """A SIGKILLed rank's watchdog is reparented and reaped later; meanwhile kill(pid, 0) still
    succeeds, and `probe ps --clean` used to keep the dead job's files (removed 0)."""
    # GIVEN a child that has exited and is not reaped yet (a zombie)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = Path(f"/proc/{zombie.pid}/stat")
    wait_until(lambda: stat.read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z", 30,
               "the child never exited")
    try:
        (tmp_path / f"{zombie.pid}.sock").write_text("")
        # WHEN / THEN its files are swept
        assert rundir.sweep(str(tmp_path)) == [f"{zombie.pid}.sock"]
    finally:
        zombie.wait()
