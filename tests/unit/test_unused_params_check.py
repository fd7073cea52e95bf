"""doctor's unused-parameter check (pure): needed, crash, only costs time, quiet."""

from __future__ import annotations

from probe_cli.diagnose.checks import Context
from probe_cli.diagnose.findings import RankDoc, Report
from probe_cli.diagnose.hang import HangVerdict
from probe_cli.diagnose.unused_params import check_unused_params


def doc(rank, rows):
    return RankDoc(rank, answers={"unused_params": rows})


def run(*docs):
    report = Report()
    check_unused_params(report, Context(HangVerdict(False, "no hang"), list(docs), 5.0))
    return report


def unused(flag, steps=5, recorded=5):
    return [{"module": "aux", "params": "aux.bias, aux.weight", "steps_unused": steps,
             "first_unused": 1, "numel": 33, "steps_recorded": recorded, "find_unused": flag},
            {"module": None, "params": None, "steps_unused": recorded - steps,
             "first_unused": None, "numel": None, "steps_recorded": recorded,
             "find_unused": flag}]


def clean(flag, recorded=5):
    return [{"module": None, "params": None, "steps_unused": recorded, "first_unused": None,
             "numel": None, "steps_recorded": recorded, "find_unused": flag}]


def test_unused_without_find_unused_is_the_crash_named_by_module():
    r = run(doc(0, unused(False, 1, 1)), doc(1, unused(False, 1, 1)))
    (f,) = r.findings
    assert f.severity == "critical" and f.ranks == [0, 1]
    assert f.title.startswith("DDP: aux gets no gradient and find_unused_parameters is off")
    assert f.detail == {"verdict": "crash", "modules": ["aux"]}


def test_unused_with_find_unused_says_it_is_needed_and_stays_info():
    r = run(doc(0, unused(True)), doc(1, unused(True, steps=2)))
    (f,) = r.findings
    assert f.severity == "info" and f.detail["verdict"] == "needed" and not r.problem
    assert "aux.bias, aux.weight" in f.evidence[0]


def test_find_unused_with_nothing_unused_only_costs_time():
    r = run(doc(0, clean(True)), doc(1, clean(True)))
    (f,) = r.findings
    assert f.detail == {"verdict": "costs_time"} and f.severity == "info"
    # without the flag, nothing unused is fine; with too few steps, no claim
    assert run(doc(0, clean(False))).findings == []
    assert run(doc(0, clean(True, recorded=2))).findings == []
    assert run(doc(0, None)).findings == [] and run(doc(0, [])).fine == []


def test_the_hf_trainer_is_told_its_own_argument_for_find_unused():
    # the Trainer makes the DDP wrapper itself (find_unused_parameters=True by default for a
    # model without activation checkpointing): "pass find_unused_parameters=False" names a
    # keyword the user never wrote; the Trainer's argument is the knob
    docs = [RankDoc(r, answers={"unused_params": clean(True),
                                "comm": [{"collectives": 300, "steps": 68,
                                          "framework": "hf_trainer"}]}) for r in (0, 1)]
    (f,) = run(*docs).findings
    assert f.next.startswith("pass --ddp_find_unused_parameters False")
    (g,) = run(doc(0, clean(True)), doc(1, clean(True))).findings
    assert g.next.startswith("pass find_unused_parameters=False")
