"""`probe lr` and `probe checkpoint` refuse destructive input before any request (issue 20)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from probe_cli.commands.checkpoint import resolve
from probe_cli.main import main

#: Nothing listens there: a command that got as far as a request would say "cannot reach".
NOWHERE = "127.0.0.1:1"


@pytest.mark.parametrize("argv, said", [
    (["--set", "nan"], "probe: lr --set nan refused: give a finite number > 0"),
    (["--set", "inf"], "probe: lr --set inf refused: give a finite number > 0"),
    (["--set", "1e400"], "probe: lr --set 1e400 refused: give a finite number > 0"),
    (["--scale", "-inf", "--force"], "probe: lr --scale -inf refused: give a finite number"),
    (["--set", "-0.1"], "probe: lr --set -0.1 refused: a learning rate cannot be negative"),
    (["--set", "abc"], "probe: lr --set 'abc' refused: give a number"),
    (["--set", "0"], "probe: lr --set 0 refused: an LR of 0 stops training"),
    (["--scale", "11"], "probe: lr --scale 11 refused: more than 10x the current LR; pass --force"),
], ids=["nan", "inf", "1e400", "-inf-forced", "negative", "text", "zero", "scale-11"])
def test_lr_refuses_in_one_line_with_exit_code_2(capsys: pytest.CaptureFixture[str], argv,
                                                  said) -> None:
    code = main(["-t", NOWHERE, "--timeout", "1", "lr", *argv])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.splitlines() == [err.strip()] and err.startswith(said), err
    assert out == ""


def test_lr_force_lets_zero_and_large_scales_through_to_the_agents(
    capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["-t", NOWHERE, "--timeout", "1", "lr", "--scale", "50", "--force"])
    _, err = capsys.readouterr()
    assert code == 1 and "cannot reach agent at http://127.0.0.1:1" in err, err


def test_checkpoint_resolves_a_relative_path_against_the_cli_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve("ck/x.pt") == (str(tmp_path / "ck" / "x.pt"),
                                  f"probe: checkpoint path {tmp_path / 'ck' / 'x.pt'} (ck/x.pt "
                                  "resolved against this shell's working directory)")
    assert resolve("/abs/x.pt") == ("/abs/x.pt", "probe: checkpoint path /abs/x.pt")
    assert resolve("~/x.pt")[0] == os.path.expanduser("~/x.pt")
