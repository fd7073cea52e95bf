"""The tracer's C++ build runs only in a directory of ours that nobody else can write
(native_build.private_dir): on shared scratch, uid 65534 must not get a planted build.log link
acted on (it truncated an owner's file) or a build.ninja swapped in (ninja ran it as the owner).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from probe_agent.collectors.tracer import native_build
from tests.foreign import FOREIGN_UID, need_root, run_as


@pytest.fixture
def scratch() -> Iterator[Path]:
    d = Path(f"/tmp/probe-native-{uuid.uuid4().hex[:8]}")
    d.mkdir()
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _squat(build_dir: str, victim: str) -> bool:
    os.mkdir(build_dir, 0o777)
    os.chmod(build_dir, 0o777)
    os.symlink(victim, os.path.join(build_dir, "build.log"))
    with open(os.path.join(build_dir, "build.ninja"), "w") as f:
        f.write("rule pwn\n  command = touch /tmp/pwned\nbuild all: pwn\n")
    return True


def test_a_build_dir_another_uid_made_first_is_refused(scratch: Path, tmp_path: Path):
    need_root()
    victim = tmp_path / "owner.txt"
    victim.write_text("the owner's file\n")
    build_dir = scratch / "probe_trace_native_0123456789abcdef"
    run_as(FOREIGN_UID, _squat, str(build_dir), str(victim))
    with pytest.raises(PermissionError) as e:
        native_build.build(build_dir.name, build_dir)
    msg = str(e.value)
    assert "\n" not in msg and f"PROBE_NATIVE_DIR={build_dir}" in msg
    assert f"owned by uid {FOREIGN_UID}" in msg
    assert victim.read_text() == "the owner's file\n"


def test_a_build_dir_others_can_write_is_refused(tmp_path: Path):
    build_dir = tmp_path / "native" / "probe_trace_native_x"
    build_dir.mkdir(parents=True)
    build_dir.chmod(0o777)
    with pytest.raises(PermissionError, match="is writable by others"):
        native_build.private_dir(build_dir)


def test_a_private_dir_is_made_0700_even_in_shared_scratch(scratch: Path):
    build_dir = scratch / "native" / "probe_trace_native_y"
    native_build.private_dir(build_dir)
    assert oct(build_dir.stat().st_mode & 0o777) == "0o700"
    assert oct(build_dir.parent.stat().st_mode & 0o777) == "0o700"
