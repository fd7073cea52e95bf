"""Request bodies are probe_protocol classes (probe_protocol/requests.py): the CLI builds them,
the agent reads them with the same class, each with its own checks and its OpenAPI schema; the
format version and the one finder of sql/."""

from __future__ import annotations

import pytest

from probe_protocol import sqlfiles
from probe_protocol.actions import ActionRequest, FlameRequest
from probe_protocol.bodies import EvalRequest, RefusalReport, TraceRequest
from probe_protocol.query import QueryRequest
from probe_protocol.requests import RequestError
from probe_protocol.version import FORMAT, disagreement


def problems(cls, body) -> list[tuple[str, str]]:
    with pytest.raises(RequestError) as e:
        cls.from_wire(body)
    return e.value.problems


def test_what_the_cli_builds_is_what_the_agent_reads():
    # GIVEN the bodies the commands build
    sent = [ActionRequest(kind="lr", scale=2.0, id="a1", step=5, group=[0, 1]),
            ActionRequest(kind="profile", profile={"ahead": 3}),
            ActionRequest(kind="guard", guard={"off": True}),
            ActionRequest(kind="later", extra={"window": {"n": 2}}),
            FlameRequest(seconds=2.0, id="f1"), QueryRequest("SELECT 1", 10),
            EvalRequest("1 + 1", "E7"), TraceRequest("every:3")]
    # THEN each reads back as itself
    for r in sent:
        assert type(r).from_wire(r.to_wire()) == r, r


def test_a_newer_kinds_arguments_travel_without_a_field_of_their_own():
    r = ActionRequest.from_wire({"kind": "later", "window": {"n": 2}})
    assert r.extra == {"window": {"n": 2}} and r.fields()["window"] == {"n": 2}
    assert r.to_wire()["window"] == {"n": 2}


@pytest.mark.parametrize("body, where, says", [
    ({"set": True}, "set", "Value error, give a JSON number, not bool True"),
    ({"set": "0.5"}, "set", "give a JSON number, not str"),
    ({"set": -1}, "set", "Input should be greater than or equal to 0"),
    ({"step": True}, "step", "Value error, give a JSON number, not bool"),
    ({"force": "yes"}, "force", "Input should be a valid boolean"),
    ({"id": "no spaces"}, "id", "String should match pattern"),
    ({"group": [0, 1.5]}, "group", "Input should be a list of whole JSON numbers"),
], ids=["bool-number", "text-number", "negative", "bool-step", "text-flag", "bad-id",
        "fractional-rank"])
def test_a_wrong_field_is_named_with_what_is_wrong(body, where, says):
    got = problems(ActionRequest, body)
    assert any(k == where and says in m for k, m in got), got


def test_required_fields_choices_and_the_body_itself():
    assert ("sql", "Field required") in problems(QueryRequest, {})
    assert problems(QueryRequest, [1]) == [("", "Input should be a valid dictionary (a JSON "
                                                 "object)")]
    assert problems(TraceRequest, {"mode": "sometimes"})[0][0] == "mode"
    assert problems(FlameRequest, {"sampler": "gdb"})[0][0] == "sampler"
    assert problems(FlameRequest, {"seconds": 0})[0] == ("seconds",
                                                         "Input should be greater than 0")
    bad = {"refusals": [{"client": "x", "what": "GET /", "reason": "r", "message": 5}]}
    assert "refusals.0.message" in problems(RefusalReport, bad)[0][1]


def test_the_openapi_schema_says_the_same_rules():
    s = ActionRequest.json_schema()
    assert s["properties"]["scale"]["minimum"] == 0
    assert s["properties"]["kind"]["default"] == "step-eval"
    assert "extra" not in s["properties"]
    assert QueryRequest.json_schema()["required"] == ["sql"]
    assert FlameRequest.json_schema()["properties"]["sampler"]["enum"] == [
        "auto", "py-spy", "in-process"]


def test_a_format_disagreement_says_who_is_older_and_what_to_do():
    assert disagreement(FORMAT, "rank 0's agent") is None
    older = disagreement(None, "rank 3's agent")
    assert older is not None and "format 1" in older and "upgrade probe in the training" in older
    newer = disagreement(FORMAT + 1, "this copy")
    assert newer is not None and "pip install -U probe-torch" in newer


def test_one_finder_knows_where_sql_is():
    from probe_agent.store.catalog import sql_dir

    assert sqlfiles.sql_dir() == sql_dir()
    assert (sqlfiles.queries_dir() / "doctor_loop.sql").is_file()
    assert "CREATE TABLE" in sqlfiles.schema_text()
