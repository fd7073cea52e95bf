"""The step guard on a real 2-rank DDP job (issue 40): armed by `probe guard` at one step on
every rank, it skips the step whose gradients are NaN (born on rank 1 from one sample) on both
ranks, leaving every rank's weights and optimizer state bit-identical to before that step; the
job trains on; the firing is in python.audit and in `probe numerics`, which also names where the
NaN was born. One job, several assertions (the suite's time budget)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from probe_cli.main import main
from tests.e2e.training import training_job
from tests.support import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def logged(log_dir: Path, rank: int) -> list[dict]:
    path = log_dir / f"rank{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def test_the_guard_skips_the_nan_step_on_every_rank_bit_identically(tmp_path, capsys):
    logs, fault = tmp_path / "logs", tmp_path / "fault"
    logs.mkdir()
    args = ("--scenario", "num_nan", "--ready-step", "3", "--step-s", "0.02",
            "--fault-file", str(fault), "--log-dir", str(logs))
    with training_job(tmp_path, "numerics_job.py", args, nproc=2,
                      env={"PROBE_TRACE": "every:5"}) as (_, infos):
        target = ",".join(i["url"].removeprefix("http://") for i in infos)
        # GIVEN the guard armed on both ranks
        code, out = run_cli(capsys, "-t", target, "guard", "--skip-nonfinite")
        assert code == 0 and "guard armed after step" in out, out
        # WHEN rank 1 meets an all-zero sample (0/0 in its first module) at its next step
        fault.touch()

        def bad_step() -> int | None:
            rows = logged(logs, 1)
            return next((r["step"] for r in rows if not math.isfinite(r["loss"])), None)

        wait_until(bad_step, 120, "rank 1 never logged a NaN loss")
        bad = bad_step()
        wait_until(lambda: all(len(logged(logs, r)) >= bad + 5 for r in (0, 1)), 120,
                   "the job did not go on after the bad step")
        # THEN on both ranks the bad step changed nothing: parameters and optimizer state are
        # bit-identical to the step before, and identical across ranks; training went on
        by = {r: {x["step"]: x for x in logged(logs, r)} for r in (0, 1)}
        for r in (0, 1):
            assert by[r][bad]["params"] == by[r][bad - 1]["params"], r
            assert by[r][bad]["state"] == by[r][bad - 1]["state"], r
            assert by[r][bad + 1]["params"] != by[r][bad]["params"], r
            assert all(math.isfinite(by[r][s]["loss"]) for s in range(bad + 1, bad + 5)), r
        for s in (bad - 1, bad, bad + 1, bad + 4):
            assert by[0][s]["params"] == by[1][s]["params"], s
        # AND the firing is audited on both ranks at that step
        code, out = run_cli(capsys, "-t", target, "--json", "query",
                            "SELECT at_step, outcome FROM python.audit WHERE kind = 'guard' "
                            "AND outcome = 'fired'")
        fired = [row for body in json.loads(out) for row in body["rows"]]
        assert fired == [[bad, "fired"], [bad, "fired"]], out
        # AND probe numerics shows the firing and names where the NaN was born
        code, out = run_cli(capsys, "-t", target, "--json", "numerics")
        body = json.loads(out)
        checks = {f["check"]: f for f in body["findings"]}
        assert code == 4 and "guard" in checks, out
        assert f"step {bad}" in checks["guard"]["title"]
        nan = checks["nonfinite"]
        assert nan["ranks"] == [1] and "module '0' (UnitNorm)" in nan["title"], nan["title"]
        assert "forward" in nan["title"]
        # AND disarming works
        code, out = run_cli(capsys, "-t", target, "guard", "--off")
        assert code == 0 and "guard off" in out and "fired 1 times" in out, out
