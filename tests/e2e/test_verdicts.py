"""The short fault suite (issue 14; the full one is bench/verdicts.py): real 2-rank torchrun jobs
on gloo, each scored by the same harness. A healthy job gets no verdict from any command, a
256 KiB-per-step leak is named, and a rank spinning in C with its GIL held is named first with
its stack read from outside the process."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from bench.verdicts import SCENARIOS, build_lib, run
from tests.e2e.procs import require_pyspy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
BY_NAME = {s.name: s for s in SCENARIOS}


def outcomes(name: str, tmp: Path, lib: str | None = None,
             asked: tuple[str, ...] = ("hang", "straggler", "doctor"), **change) -> dict:
    """The verdicts of ``asked`` (only the commands a test asserts on: each is two CLI runs;
    `probe memory`'s summary line, asserted by none, is left to the bench)."""
    sc = replace(BY_NAME[name], **change)
    return {o.command: o for o in run(sc, tmp / name, lib, asked=asked, memory=False)}


def test_a_healthy_job_gets_no_verdict(tmp_path: Path):
    # GIVEN a healthy 2-rank job, judged at step 120 (past the memory check's minimum window)
    found = outcomes("healthy", tmp_path, ready_step=120)
    # THEN hang, straggler and doctor all exit 0, doctor with nothing above info
    for command in ("hang", "straggler", "doctor"):
        o = found[command]
        assert o.exit == 0 and o.right and not o.kinds, (command, o.headline, o.body)
    assert all(f["severity"] == "info" for f in found["doctor"].body["findings"])
    # AND the hang verdict says what it rests on: the job's own rhythm, not a fixed 5 s
    hang = found["hang"].body
    assert hang["confidence"] in ("high", "medium") and "90th percentile" in hang["basis"]


def test_a_leak_of_256_kib_per_step_is_named(tmp_path: Path):
    # GIVEN a job that keeps one 256 KiB tensor every step, judged at step 250
    found = outcomes("leak", tmp_path)
    # THEN doctor names memory growth on both ranks, with its evidence, and nothing else
    doctor = found["doctor"]
    assert doctor.right and doctor.exit == 4, doctor.headline
    [mem] = [f for f in doctor.body["findings"] if f["check"] == "memory"]
    assert mem["ranks"] == [0, 1] and mem["severity"] == "warning"
    assert "robust slope" in mem["evidence"][0] and "3/3 quarters rising" in mem["evidence"][0]
    assert found["hang"].exit == 0 and found["straggler"].exit == 0


def test_a_gil_held_hang_names_the_culprit_and_where_it_is(tmp_path: Path):
    require_pyspy()
    lib = build_lib(tmp_path)
    if lib is None:
        pytest.skip("needs a C compiler (cc) to build the GIL-holding library")
    # GIVEN rank 1 spinning in C with its GIL held, where rank 0 waits in all_reduce
    found = outcomes("hang_gil", tmp_path, lib, asked=("hang", "doctor"))
    hang = found["hang"]
    # THEN the headline leads with rank 1 and the function it is stuck in
    assert re.fullmatch(r"HANG: rank 1 never reached all_reduce #\d+; it is in spin_with_gil "
                        r"\(fault_job\.py:\d+\)\. 1 rank waits for it, for [\d.]+ s",
                        hang.headline), hang.headline
    assert hang.culprits == [1] and hang.exit == 4
    # AND its stack was read from outside the process, since its agent could not answer
    details = "\n".join(hang.body["details"])
    assert "the stack was read from outside the process" in details, details
    assert "    spin_with_gil (fault_job.py:" in details
    assert found["doctor"].right, found["doctor"].headline
