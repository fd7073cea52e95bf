"""Every body of probe_protocol round-trips: ``from_wire(to_wire(body)) == body``, through JSON
text too, for an example of each with every field set (so a field that ``to_wire`` writes and
``from_wire`` does not read back, or reads as another type, fails here). The examples are
checked to cover every body class the package defines: a new body needs an example.

Real agents' answers are held to the same classes in tests/integration/test_wire_contract.py.
"""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from probe_protocol import actions, bodies, envelope, query
from probe_protocol.envelope import ErrorBody, WireBody

THREAD = {"thread_id": 7, "thread_name": "MainThread", "is_main": True, "is_agent": False,
          "frames": [{"depth": 0, "func": "step", "file": "t.py", "lineno": 3,
                      "frame_type": "Python", "locals": None}]}
ACTION = {"id": "a1", "kind": "lr", "step": 12, "state": "ok", "data": {"step": 12}}

EXAMPLES = [
    envelope.ErrorBody(3, 409, "rank 3 is past step 12", {"reason": "past", "current_step": 13}),
    query.QueryBody(2, ("module", "n"), ("VARCHAR", "BIGINT"), (["fc1", 12], ["fc2", 3]), True,
                    1.5, "PROBE_MAX_ROWS=2"),
    query.QueryRequest("SELECT 1", 10),
    query.CannedRequest({"last": 20}),
    query.ArrowBody(1, True, b"\xff\xff"),
    bodies.HealthBody(0, "ok", "ab12"),
    bodies.HealthBody(1, "unhealthy", None, "hung", "no optimizer step for 400 s", 12, 400.0,
                      0.2, 0.5, "node-3", 4242),
    bodies.PostmortemNowBody(0, "/tmp/probe-0/postmortem/job/rank-0", 1795770000.5),
    bodies.PostmortemNowBody(1, None, None, "no post-mortem copy (PROBE_POSTMORTEM=off)"),
    bodies.InfoBody(1, 1, 2, 4242, "node1", "3.11.2", "2.13.0", "0.9", 1700000000.5, 12.25,
                    "http://node1:9701", "/tmp/probe-0/4242.sock", ("train.py", "--lr"),
                    "every:10", {"pid": 4243, "restarts": 1}, 0.02,
                    {"mode": "owner", "refused": 0}, 0.5),
    bodies.RanksBody(0, (bodies.RankEntry(0, "http://a:9700", "a", 1, "sig0"),
                         bodies.RankEntry(1, None, "b", 2)), 2, {"state": "ok"}, True),
    bodies.EvalRequest("1 + 1"),
    bodies.EvalBody(0, "e1", "2", "hi\n", "warn\n", 0.25, "Traceback ...", "ZeroDivisionError"),
    bodies.EvalJobBody(0, {"id": "e1", "state": "running", "still_running": True}),
    bodies.EvalListBody(0, ({"id": "e1", "state": "ok"}, {"id": "e2", "state": "running"})),
    bodies.BacktraceBody(0, 4242, "node1", "in-process", "sys._current_frames", None, False,
                         "3.11.2", threads=(THREAD,), elapsed_ms=0.5),
    bodies.BacktraceBody(1, 4242, "node1", "out-of-process", "py-spy", "GIL held", True, None,
                         "stopped", "kill -CONT 4242", 7, True, 3.5, 1532, threads=(THREAD,),
                         elapsed_ms=40.0),
    bodies.BacktraceBody(2, 4242, "node1", "watchdog", "py-spy", "rank 2 is dead", None, None,
                         "dead", exit={"signal": 9, "description": "killed"}, last_step=1532,
                         died_at=1700000001.0, last_backtrace={"route": "py-spy"},
                         threads=(THREAD,)),
    bodies.CollectivesBody(0, True, ({"seq": 1, "op": "all_reduce", "state": "done"},), 17.5),
    bodies.QueriesBody(0, ({"name": "slow_modules", "description": "d", "params": ["last"]},)),
    bodies.TraceRequest("every:5"),
    bodies.TraceBody(0, "every:10", True, False, 40, True, 1, False, "boom", 5, True, "native",
                     "native", {"counting": True, "failures": 0, "last_error": None}),
    bodies.DoctorBody(0, 17.5, {"step": 3}, {"dataloader_wrapped": True},
                      ({"index": 0, "class": "SGD", "groups": []},), ("StepLR",),
                      {"cuda:0": 81559.0}),
    bodies.GradsBody(0, True, 12, 4, 0, 1, 0.75),
    bodies.GradsBody(1, False, 12, reason="no optimizer step within 2 s"),
    bodies.TensorsBody(0, 12, 11, 40, 1.5, ({"device": "cpu", "count": 4},), 3.5),
    bodies.TensorsBody(0, None, None, 0, 0.0, (), None, "torch is not imported"),
    bodies.RefusalReport(({"client": "1.2.3.4:5", "what": "GET /v1/info", "reason": "token",
                           "message": "401"},), 3),
    bodies.RecordedBody(0, 2),
    actions.StepBody(0, 12, True, True, True, "counted", 1.5, 2.5, ("SGD",), 0, 12, 1, 30.0,
                     17.5),
    actions.ActionBody(0, 12, None, ACTION, "duplicate"),
    actions.ActionListBody(0, 12, 12, (ACTION,)),
    actions.FinishedAction(0, "ok", 12, {"step": 12}),
    actions.ResumeRequest("me@laptop"),
    actions.ActionRequest(kind="lr", step=12, set=0.01, force=True, id="a1", group=[0, 1],
                          requested_by="me@laptop", extra={"later": {"n": 1}}),
    actions.FlameRequest(2.0, 50.0, 60.0, "in-process", "f1", "me@laptop"),
    bodies.NumericsRequest({"spike_factor": 3.0}),
    bodies.NumericsBody(0, {"thresholds": {"spike_factor": 3.0}, "last": None}),
    actions.ResumeBody(0, 12, ("p1",), "released at step 12", 12),
    actions.ProfileBody(0, 12, 17.5, {"id": "p1", "state": "done"}),
    actions.FlameBody(0, 12, {"id": "f1", "state": "sampling"}),
]


def _id(body: object) -> str:
    return type(body).__name__


@pytest.mark.parametrize("body", EXAMPLES, ids=_id)
def test_every_body_round_trips_through_its_wire_form(body):
    # WHEN the body is written and read back, as a dict and as the JSON text on the wire
    wire = body.to_wire()
    text = json.loads(json.dumps(wire, default=lambda b: b.decode("latin-1")))
    # THEN it is the same body (the Arrow bytes only travel as a dict: --json drops them)
    assert type(body).from_wire(wire) == body
    if not isinstance(body, query.ArrowBody):
        assert type(body).from_wire(text) == body


@pytest.mark.parametrize("body", [b for b in EXAMPLES if isinstance(b, WireBody)], ids=_id)
def test_every_success_body_starts_with_the_envelope(body):
    assert list(body.to_wire())[:2] == ["ok", "rank"] and body.to_wire()["ok"] is True


def test_an_error_body_has_its_four_keys_first():
    wire = EXAMPLES[0].to_wire()
    assert list(wire)[:4] == ["ok", "rank", "status", "error"] and wire["ok"] is False
    assert ErrorBody.from_wire(wire).extra == {"reason": "past", "current_step": 13}


def test_the_examples_cover_every_body_of_the_package():
    """A body class added without an example here is a contract nobody round-trips."""
    defined = {cls for mod in (envelope, query, bodies, actions)
               for _, cls in inspect.getmembers(mod, inspect.isclass)
               if cls.__module__ == mod.__name__ and dataclasses.is_dataclass(cls)
               and hasattr(cls, "from_wire") and hasattr(cls, "to_wire")}
    covered = {type(b) for b in EXAMPLES} | {bodies.RankEntry}  # inside RanksBody
    assert defined - covered == set(), sorted(c.__name__ for c in defined - covered)
    assert len(defined) >= 25


def test_a_field_sent_only_sometimes_is_left_out_and_read_back_as_absent():
    # GIVEN an in-process backtrace: none of the watchdog's facts apply
    wire = next(b for b in EXAMPLES if getattr(b, "source", "") == "in-process").to_wire()
    # THEN none of them is sent, not even as null; the out-of-process one sends its nulls
    assert not {"reason", "state", "stopped", "gil_holder", "exit", "died_at"} & set(wire)
    oop = next(b for b in EXAMPLES if getattr(b, "source", "") == "out-of-process").to_wire()
    assert {"stopped", "gil_holder", "gil_held", "heartbeat_age_s", "step"} <= set(oop)
