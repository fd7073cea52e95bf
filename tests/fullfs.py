"""Filesystem fixtures for the checkpoint tests (issue 20): a filesystem that is (almost) full
(a 1 MiB tmpfs) and a private character device.

Mounting and mknod need root (CI runs as root); elsewhere the tests that use them skip and say
why. tests/conftest.py registers this module (``pytest_plugins``), so any test names the
fixtures as parameters without importing them.
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


@pytest.fixture
def char_device(tmp_path: Path) -> Path:
    """A private character device like /dev/null (c 1 3): a regression here must not destroy
    the machine's own /dev/null."""
    dev = tmp_path / "nulldev"
    done = subprocess.run(["mknod", str(dev), "c", "1", "3"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mknod is not permitted here: {done.stderr.strip()}")
    return dev
