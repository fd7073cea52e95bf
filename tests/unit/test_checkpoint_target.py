"""checkpoint_target: where a checkpoint may be written (issue 20). Stdlib only, real files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from probe_agent.actions.checkpoint_target import (
    CheckpointError,
    check_destination,
    commit_directory,
    commit_file,
    disk_full,
)


@pytest.mark.parametrize("layout", [None, "file", "directory"])
@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_a_device_is_refused_in_every_case(char_device: Path, layout, overwrite) -> None:
    with pytest.raises(CheckpointError, match="is a character device: a checkpoint is written"):
        check_destination(str(char_device), overwrite=overwrite, layout=layout)


def test_commit_never_replaces_a_device(char_device: Path, tmp_path: Path) -> None:
    # GIVEN a finished temporary file and a device at the destination
    tmp = tmp_path / "ck.tmp-1"
    tmp.write_bytes(b"checkpoint")
    # WHEN it is committed, even with overwrite (os.replace would swap the device node out)
    for overwrite in (False, True):
        with pytest.raises(CheckpointError):
            commit_file(str(tmp), str(char_device), overwrite=overwrite)
    # THEN the device is still a device
    assert stat.S_ISCHR(os.lstat(char_device).st_mode)


def test_commit_without_overwrite_keeps_an_existing_file(tmp_path: Path) -> None:
    tmp, path = tmp_path / "ck.tmp-1", tmp_path / "ck.pt"
    tmp.write_bytes(b"new")
    path.write_bytes(b"old")
    with pytest.raises(CheckpointError) as info:
        commit_file(str(tmp), str(path), overwrite=False)
    assert info.value.status == 409 and info.value.extra == {"reason": "exists"}
    assert path.read_bytes() == b"old"
    commit_file(str(tmp), str(path), overwrite=True)
    assert path.read_bytes() == b"new" and not tmp.exists()


def test_commit_to_a_new_path_leaves_only_the_file(tmp_path: Path) -> None:
    tmp, path = tmp_path / "ck.tmp-1", tmp_path / "ck.pt"
    tmp.write_bytes(b"new")
    commit_file(str(tmp), str(path), overwrite=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.pt"]


def test_a_dangling_symlink_counts_as_existing(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="is a dangling symlink: a checkpoint"):
        check_destination(str(link), overwrite=True, layout="file")


def test_a_sharded_checkpoint_replaces_only_a_checkpoint_directory(tmp_path: Path) -> None:
    # GIVEN an old sharded checkpoint, a plain directory and a file
    old = tmp_path / "old"
    old.mkdir()
    (old / ".metadata").write_bytes(b"old")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "keep").write_text("x")
    afile = tmp_path / "afile"
    afile.write_text("x")
    new = tmp_path / "new.tmp-1"
    new.mkdir()
    (new / ".metadata").write_bytes(b"new")
    # THEN the plain directory and the file are refused, even with overwrite
    with pytest.raises(CheckpointError, match="not a torch.distributed.checkpoint"):
        commit_directory(str(new), str(plain), overwrite=True, tag="1")
    with pytest.raises(CheckpointError, match="never replaces a file"):
        commit_directory(str(new), str(afile), overwrite=True, tag="1")
    # ... the old checkpoint only with overwrite
    with pytest.raises(CheckpointError, match="exists"):
        commit_directory(str(new), str(old), overwrite=False, tag="1")
    commit_directory(str(new), str(old), overwrite=True, tag="1")
    assert (old / ".metadata").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "old", "plain"]
    assert (plain / "keep").exists() and afile.read_text() == "x"


def test_disk_full_is_found_behind_torchs_runtime_error(tmp_path: Path) -> None:
    # torch.save raises RuntimeError("[enforce fail at inline_container.cc:672] ...") with the
    # write's OSError as its context
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos")
    except RuntimeError as e:
        err = disk_full(e, str(tmp_path), 5 << 20)
    assert err is not None
    assert str(err).startswith(f"disk full (No space left on device) at {tmp_path}: the "
                               "checkpoint needs about 5.0 MiB and ")
    assert disk_full(RuntimeError("something else"), str(tmp_path), 1) is None
    quota = disk_full(OSError(122, "Disk quota exceeded"), str(tmp_path), None)
    assert quota is not None and str(quota).startswith("disk quota exceeded")


def test_a_socket_and_a_fifo_are_refused_even_with_overwrite(tmp_path: Path) -> None:
    import socket

    sock_path, fifo = tmp_path / "s.sock", tmp_path / "fifo"
    os.mkfifo(fifo)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock_path))
        for path, kind in ((sock_path, "a socket"), (fifo, "a FIFO")):
            with pytest.raises(CheckpointError, match=f"is {kind}: a checkpoint is written"):
                check_destination(str(path), overwrite=True, layout=None)
        assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
