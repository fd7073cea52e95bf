"""A filesystem that is (almost) full, for checkpoint tests (issue 20): a 1 MiB tmpfs.

Mounting needs root (CI runs as root); elsewhere the tests that use it skip and say why.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on its own 1 MiB tmpfs, unmounted at teardown."""
    where = tmp_path / "tiny"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs here: {done.stderr.strip() or done.stdout}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path, leave: int) -> None:
    """Leave only ``leave`` bytes free on ``where``'s filesystem (in a file named ``hog``)."""
    st = os.statvfs(where)
    with open(where / "hog", "wb") as f:
        f.write(b"\0" * max(0, st.f_bfree * st.f_frsize - leave))
