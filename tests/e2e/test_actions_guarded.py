"""Actions that cannot destroy, on a real 2-rank torchrun job through the real CLI (issue 20).

One short job takes every refusal in turn: a checkpoint onto an existing file, onto a device,
onto a full tmpfs, an `lr --set` of 1e30, nan, inf and 1e400, and an API body with
``{"set": true}``. Each is refused with one clear line, nothing is destroyed, and both ranks keep
stepping.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_actions import PROGRAM, cli, last_step, targets
from tests.e2e.training import probe, training_job
from tests.fullfs import fill
from tests.support import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_refusals_destroy_nothing_and_training_continues(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    full_disk: Path,
) -> None:
    log_dir = tmp_path / "log"
    mine = tmp_path / "notes.txt"
    mine.write_text("precious")
    fill(full_disk, 8 << 10)
    args = ("--log-dir", str(log_dir), "--opt", "sgd", "--sched", "none")
    with training_job(tmp_path, PROGRAM, args, nproc=2, timeout=150) as (proc, infos):
        t = targets(infos)

        def still_training() -> None:
            now = min(last_step(log_dir, r) for r in (0, 1))
            wait_until(lambda: min(last_step(log_dir, r) for r in (0, 1)) > now + 2, 60,
                       "training stopped after a refusal")

        # WHEN a checkpoint is aimed at an existing file
        res = cli(capsys, "-t", t, "checkpoint", str(mine))
        # THEN it is refused with what to do, and the file is unchanged
        assert res.returncode == 1, res.stdout + res.stderr
        assert f"{mine} exists (a file): pass --overwrite" in res.stderr, res.stderr
        assert mine.read_text() == "precious"
        still_training()

        # WHEN it is aimed at a character device (/dev/null's twin, made here: were the guard
        # ever broken, the machine's own /dev/null must not be what a test run replaces)
        null = tmp_path / "null"
        made = subprocess.run(["mknod", str(null), "c", "1", "3"], capture_output=True, text=True)
        if made.returncode == 0:
            res = cli(capsys, "-t", t, "checkpoint", "--overwrite", str(null))
            assert res.returncode == 1 and f"{null} is a character device" in res.stderr, res
            assert stat.S_ISCHR(os.stat(null).st_mode)
            still_training()

        # WHEN the disk is full (a tmpfs with 8 KiB left)
        res = cli(capsys, "-t", t, "checkpoint", str(full_disk / "ck.pt"))
        assert res.returncode == 1, res.stdout + res.stderr
        assert f"disk full: {full_disk} has 8.0 KiB free and the checkpoint needs about" in (
            res.stderr), res.stderr
        assert sorted(p.name for p in full_disk.iterdir()) == ["hog"]  # no tmp left
        still_training()

        # WHEN a relative path is given with --overwrite, from another directory
        here = tmp_path / "operator"
        here.mkdir()
        monkeypatch.chdir(here)
        res = cli(capsys, "-t", t, "checkpoint", "--overwrite", "ck.pt")
        # THEN it lands in the CLI's directory, and the CLI says the absolute path it used
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"probe: checkpoint path {here / 'ck.pt'} (ck.pt resolved against" in res.stderr
        assert (here / "ck.pt").is_file() and (here / "ck.pt.rng.rank1").is_file()

        # WHEN the LR is set 1e31 times higher
        res = cli(capsys, "-t", t, "lr", "--set", "1e30")
        assert res.returncode == 1, res.stdout + res.stderr
        assert "lr --set 1e+30 refused: 5e+31x the current largest LR (0.02, SGD[0])" in (
            res.stderr), res.stderr
        still_training()

        # WHEN nan, inf or 1e400 is given (once through the real binary: no traceback, exit 2)
        for value in ("nan", "inf", "1e400"):
            res = cli(capsys, "-t", t, "lr", "--set", value)
            assert res.returncode == 2, res.stdout + res.stderr
            assert res.stderr.strip() == (f"probe: lr --set {value} refused: give a finite "
                                          "number > 0 (nan, inf and values beyond 1.8e308 are "
                                          "not learning rates)"), res.stderr
        real = probe("-t", t, "lr", "--scale", "nan")
        assert real.returncode == 2 and "Traceback" not in real.stderr, real.stderr
        assert real.stderr.startswith("probe: lr --scale nan refused"), real.stderr

        # WHEN the API gets a JSON boolean for the LR
        r = httpx.post(infos[0]["url"] + "/v1/actions", json={"kind": "lr", "set": True},
                       timeout=10)
        assert r.status_code == 422 and "give a JSON number, not bool" in r.json()["error"]

        # THEN nothing changed the LR, and both ranks keep stepping
        lr = cli(capsys, "-t", t, "--json", "eval", "optimizer.param_groups[0]['lr']")
        assert lr.returncode == 0 and lr.stdout.count('"result": "0.02"') == 2, lr.stdout
        still_training()
