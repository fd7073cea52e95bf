"""probe_cli's list of run dirs to look in (issue 20, item 5): the fallback places the agent
uses, but only directories of ours that nobody else can write to. Real directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from probe_cli.transport.targets import local_run_dirs


@pytest.mark.parametrize("mode, listed", [(0o700, True), (0o777, False), (0o770, False)],
                         ids=["private", "world-writable", "group-writable"])
def test_a_fallback_dir_is_listed_only_when_private(tmp_path: Path, monkeypatch, mode: int,
                                                     listed: bool):
    # GIVEN $XDG_RUNTIME_DIR/probe of ours with the given mode
    (tmp_path / "probe").mkdir()
    os.chmod(tmp_path / "probe", mode)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    # WHEN / THEN the CLI looks there only when nobody else could have planted files in it
    dirs = local_run_dirs(str(tmp_path / "named"))
    assert (str(tmp_path / "probe") in dirs) is listed
