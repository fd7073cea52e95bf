"""The wire contract (docs/http-api.md) from both sides, in one place (issue 18, item 1).

The agent builds its bodies with probe_protocol's classes and the CLI reads them with the same
classes; this test holds both to the page: the documented error body is what ``error_body``
builds, a real agent's answers carry exactly the keys the routes table lists, and ``from_wire``
reads those very answers.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from probe_protocol.bodies import EvalBody
from probe_protocol.envelope import Envelope, error_body
from probe_protocol.query import QueryBody
from tests.support import ROOT

PAGE = (ROOT / "docs" / "http-api.md").read_text()
ENVELOPE = ("ok", "rank")
ERROR_KEYS = ("ok", "rank", "status", "error")


def documented_error_body() -> dict:
    section = PAGE[PAGE.index("## Error body"):]
    return json.loads(re.search(r"```json\n(.*?)\n```", section, re.S).group(1))


def documented_keys(route: str) -> set[str]:
    """The success body's keys for ``route`` (``POST /v1/query``), from the routes table: the
    envelope and the backticked names of its last column, before any ``;`` (what follows it
    explains them)."""
    for line in PAGE.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] == f"`{route}`":
            names = re.findall(r"`([^`]*)`", cells[2].split(";")[0])
            return {*ENVELOPE, *(k.strip() for n in names for k in n.split(","))}
    raise AssertionError(f"{route} is not in docs/http-api.md's routes table")


#: Keys a body carries only sometimes (``truncated_by``: only when a cap cut the rows).
OPTIONAL = {"truncated_by"}


def test_the_documented_error_body_is_what_the_agent_builds():
    doc = documented_error_body()
    built = error_body(doc["rank"], doc["status"], doc["error"])
    assert built == doc and list(built) == list(doc) == list(ERROR_KEYS)
    # AND the CLI reads it as an error of that status
    env = Envelope.from_wire(built)
    assert (env.ok, env.rank, env.status, env.error) == (False, 0, 400, doc["error"])


def test_the_streamed_query_body_is_the_same_body():
    """``/v1/query`` writes its body around pre-encoded rows: byte for byte the same JSON."""
    full = QueryBody(3, ("module", "n"), ("VARCHAR", "BIGINT"), (["fc1", 12], ["fc2", 3]), True,
                     1.235, "PROBE_MAX_ROWS")
    parts = QueryBody(3, full.columns, full.types, (), True, 1.235, "PROBE_MAX_ROWS").stream(
        [b'["fc1",12]', b',["fc2",3]'])
    body = json.loads(b"".join(parts))
    assert body == full.to_wire() and list(body) == list(full.to_wire())
    assert set(body) == documented_keys("POST /v1/query")


@pytest.fixture
def answers(client: httpx.Client) -> dict[str, httpx.Response]:
    return {
        "health": client.get("/v1/health"),
        "query": client.post("/v1/query", json={"sql": "SELECT 42 AS n, 'x' AS s"}),
        "bad query": client.post("/v1/query", json={"sql": "SELCT 1"}),
        "eval": client.post("/v1/eval", json={"code": "print('hi')\n1 + 1"}),
        "bad eval": client.post("/v1/eval", json={"code": "1 / 0"}),
        "no route": client.get("/v1/nothing-here"),
    }


def test_a_real_agents_bodies_carry_the_documented_keys(answers):
    health, query, ev = answers["health"].json(), answers["query"].json(), answers["eval"].json()
    assert list(health) == [*ENVELOPE, "status"] and health["status"] == "ok"
    assert set(query) == documented_keys("POST /v1/query") - OPTIONAL
    assert set(ev) == documented_keys("POST /v1/eval")
    for name in ("bad query", "bad eval", "no route"):
        r = answers[name]
        body = r.json()
        assert r.status_code >= 400 and list(body)[:4] == list(ERROR_KEYS), (name, body)
        assert body["ok"] is False and body["status"] == r.status_code and body["error"]


def test_the_clis_wire_types_read_a_real_agents_bodies(answers):
    q = QueryBody.from_wire(answers["query"].json())
    assert (q.rank, q.columns, q.types) == (0, ("n", "s"), ("INTEGER", "VARCHAR"))
    assert q.records() == [{"n": 42, "s": "x"}] and q.truncated is False
    ev = EvalBody.from_wire(answers["eval"].json())
    assert (ev.result, ev.stdout, ev.error) == ("2", "hi\n", None)
    bad = EvalBody.from_wire(answers["bad eval"].json())
    assert bad.error.startswith("ZeroDivisionError") and "<probe eval>" in bad.traceback
    for name in ("bad query", "no route"):
        env = Envelope.from_wire(answers[name].json())
        assert (env.ok, env.rank, env.status) == (False, 0, answers[name].status_code)
