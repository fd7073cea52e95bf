"""The three registries (docs/extending.md): doctor checks, action kinds and collectors are each
declared once, by the module that implements them, and the registry finds them all."""

from __future__ import annotations

from pathlib import Path

import pytest

from probe_cli.diagnose.checks import Context, DoctorCheck, Evidence
from probe_cli.diagnose.doctor import diagnose, doctor_checks, evidence, rank_doc
from probe_cli.diagnose.findings import INFO, Finding, RankDoc, Report
from probe_cli.diagnose.hang import HangVerdict, RankState
from probe_cli.gather.evidence import doctor_queries

ROOT = Path(__file__).resolve().parents[2]
NO_HANG = HangVerdict(False, "no hang")


def test_every_doctor_check_has_its_own_name_and_place():
    checks = doctor_checks()
    names = [c.name for c in checks]
    assert len(set(names)) == len(names), names
    assert [c.order for c in checks] == sorted({c.order for c in checks})
    # the hang comes first: nothing may speak over a hung job
    assert names[0] == "hang" and names[-1] == "modules"


def test_every_piece_of_evidence_is_a_canned_query_and_each_key_is_asked_once():
    queries = {p.stem for p in (ROOT / "sql" / "queries").glob("*.sql")}
    asked = doctor_queries(50)
    keys = [k for k, _, _ in asked]
    assert len(set(keys)) == len(keys)
    assert {q for _, q, _ in asked} <= queries
    # the look-back reaches the queries that take it
    assert dict((k, p) for k, _, p in asked)["loop"] == {"last": 50}


def test_a_rank_doc_files_named_and_new_evidence_alike():
    # GIVEN an answer with a named key (loop) and one only a newer check reads
    state = RankState(rank=2)
    doc = rank_doc(state, {"loop": [{"steps": 3}], "state": {"x": 1}})
    doc.file("newer", [{"a": 1}])
    # THEN both read back through rows(), and the named one is the field
    assert doc.rows("loop") == doc.loop == [{"steps": 3}]
    assert doc.rows("newer") == [{"a": 1}] and doc.rows("absent") is None


def test_a_check_module_is_all_a_new_check_needs(monkeypatch):
    """A check declared in a module of its own runs in its place, with its evidence asked."""
    import probe_cli.diagnose.doctor as doctor

    class Module:  # stands for a new module's CHECKS
        CHECKS = (DoctorCheck("answer", 115, lambda report, ctx: report.findings.append(
            Finding(INFO, "answer", f"{len(ctx.docs)} ranks: {ctx.docs[0].rows('x')}")),
            evidence=(Evidence("x", "throughput", lambda last: {"last": last}),)),)

    # WHEN the one line is added to DEFAULT_CHECKS
    monkeypatch.setattr(doctor, "DEFAULT_CHECKS", (*doctor.DEFAULT_CHECKS, Module))
    # THEN it runs after throughput (110) and before the slowest modules (120)
    names = [c.name for c in doctor_checks()]
    assert names.index("throughput") < names.index("answer") < names.index("modules")
    assert "x" in [e.key for e in evidence()]
    doc = RankDoc(0, answers={"x": [{"v": 1}]})
    report = diagnose(NO_HANG, [doc], 5.0)
    assert "1 ranks: [{'v': 1}]" in [f.title for f in report.findings]


def test_the_context_carries_the_verdict_the_checks_defer_to():
    report = Report()
    ctx = Context(HangVerdict(True, "hung"), [RankDoc(0)], 5.0)
    for check in doctor_checks():
        if check.name == "straggler":
            check.run(report, ctx)
    assert report.unchecked == ["straggler, collective wait: the job is hung (see above)"]
    # a failed collective (a peer killed) is not called a hang
    report = Report()
    ctx = Context(HangVerdict(True, "PROBLEM: a collective failed on rank 0"), [RankDoc(0)], 5.0)
    for check in doctor_checks():
        if check.name == "straggler":
            check.run(report, ctx)
    assert report.unchecked == ["straggler, collective wait: a collective failed or a rank is "
                                "gone (see above)"]


def test_every_action_kind_is_declared_once_by_its_module():
    pytest.importorskip("fastapi")
    from probe_agent.actions.kinds import DEFAULT_KINDS, KINDS

    assert list(KINDS) == ["step-eval", "lr", "checkpoint", "pause", "profile", "guard"]
    assert len(KINDS) == len(DEFAULT_KINDS)
    for module in DEFAULT_KINDS:
        assert module.KIND is KINDS[module.KIND.name]
    # the 422 messages the route gives come from the kinds
    assert KINDS["lr"].validate({"scale": None, "set": None}) == (
        "lr needs exactly one of scale or set")
    assert KINDS["lr"].validate({"scale": 2.0}) is None
    assert KINDS["checkpoint"].args({"path": "/x", "model": None, "overwrite": False}) == {
        "path": "/x"}
    assert KINDS["lr"].describe({"set": 0.1, "force": True}) == "lr set=0.1 force"


def test_every_collector_module_declares_its_spec():
    pytest.importorskip("duckdb")
    from probe_agent.collectors.registry import DEFAULT_COLLECTORS, default_specs

    specs = default_specs()
    names = [s.name for s in specs]
    assert len(specs) == len(DEFAULT_COLLECTORS) + 1  # and rank discovery
    assert len(set(names)) == len(names)
    assert names.index("steps") < names.index("tracer")  # the start order that matters
    for s in specs:
        assert set(s.needs) <= set(names), s


def test_a_collector_that_cannot_be_built_is_left_out_and_its_dependents_get_none():
    pytest.importorskip("duckdb")
    from probe_agent.clock import StepClock
    from probe_agent.collectors.registry import CollectorSpec, build_collectors
    from probe_agent.config import AgentConfig

    def broken(_):
        raise RuntimeError("no")

    seen = {}
    specs = [CollectorSpec("b", 20, lambda b: seen.setdefault("a", b.get("a")) or object(),
                           needs=("a",)),
             CollectorSpec("a", 10, broken)]
    got = build_collectors(StepClock(), 0, AgentConfig(), ranks=lambda: None, specs=specs)
    assert [n for n, _ in got.running()] == ["b"] and seen == {"a": None}


def test_the_guard_kind_refuses_what_cannot_fire_in_one_line():
    pytest.importorskip("fastapi")
    from probe_agent.actions.kinds import KINDS

    v = KINDS["guard"].validate
    assert v({"guard": {"skip_nonfinite": True}}) is None and v({"guard": {"off": True}}) is None
    assert "needs a rule that fires" in v({"guard": {"lower_lr": 0.5}})
    assert "unknown rule(s) skip_nan" in v({"guard": {"skip_nan": True}})
    assert "above 1" in v({"guard": {"skip_spike": 0.5}})
    assert "between 0 and 1" in v({"guard": {"skip_nonfinite": True, "lower_lr": 2}})
    assert "absolute" in v({"guard": {"skip_nonfinite": True, "checkpoint": "rel/dir"}})
