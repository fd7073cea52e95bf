"""The wire contract (docs/http-api.md) from both sides, in one place (issue 18, item 1).

The agent builds its bodies with probe_protocol's classes and the CLI reads them with the same
classes; this test holds both to the page: the documented error body is what ``error_body``
builds, a real agent's answers carry exactly the keys the routes table lists, and ``from_wire``
reads those very answers.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator

import httpx
import pytest

from probe_protocol import routes
from probe_protocol.actions import (
    ActionBody,
    ActionListBody,
    FlameBody,
    ProfileBody,
    ResumeBody,
    ResumeRequest,
    StepBody,
)
from probe_protocol.bodies import (
    BacktraceBody,
    CollectivesBody,
    DoctorBody,
    EvalBody,
    EvalJobBody,
    EvalListBody,
    EvalRequest,
    GradsBody,
    HealthBody,
    InfoBody,
    NumericsBody,
    NumericsRequest,
    PostmortemNowBody,
    QueriesBody,
    RanksBody,
    RecordedBody,
    RefusalReport,
    TensorsBody,
    TraceBody,
    TraceRequest,
)
from probe_protocol.envelope import Envelope, ErrorBody, error_body
from probe_protocol.query import CannedRequest, QueryBody, QueryRequest
from tests.support import ROOT, wait_until

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


# -- every route and the table of routes (tests/unit/test_docs.py holds the table to the page) --

#: Route -> the class its success body is, for every route that answers JSON.
BODY_OF = {
    routes.HEALTH: HealthBody, routes.INFO: InfoBody, routes.RANKS: RanksBody,
    routes.QUERY: QueryBody, routes.CANNED_QUERY: QueryBody, routes.QUERIES: QueriesBody,
    routes.EVAL: EvalBody, routes.EVALS: EvalListBody, routes.EVAL_JOB: EvalJobBody,
    routes.CANCEL_EVAL: EvalJobBody, routes.BACKTRACE: BacktraceBody,
    routes.COLLECTIVES: CollectivesBody, routes.TRACE: TraceBody, routes.SET_TRACE: TraceBody,
    routes.DOCTOR: DoctorBody, routes.DOCTOR_GRADS: GradsBody, routes.NUMERICS: NumericsBody,
    routes.SET_NUMERICS: NumericsBody,
    routes.MEMORY_TENSORS: TensorsBody, routes.STEP: StepBody, routes.ACTIONS: ActionListBody,
    routes.SUBMIT_ACTION: ActionBody, routes.ACTION: ActionBody, routes.CANCEL_ACTION: ActionBody,
    routes.RESUME: ResumeBody, routes.POSTMORTEM_NOW: PostmortemNowBody,
    routes.PROFILE: ProfileBody, routes.START_FLAME: FlameBody,
    routes.FLAME: FlameBody, routes.ACCESS_REFUSALS: RecordedBody,
}
#: Routes whose answer is not a JSON body: a file stream, the Prometheus text, and the CUDA
#: allocator's snapshot pickle (no CUDA here: tests/integration/memory covers it where there is).
NOT_JSON = {routes.PROFILE_TRACE, routes.METRICS, routes.MEMORY_SNAPSHOT}


class Trainer(threading.Thread):
    """A tiny optimizer loop, so the step-boundary routes have steps to act on."""

    def __init__(self) -> None:
        super().__init__(name="trainer", daemon=True)
        self.halt = threading.Event()
        self.steps = 0

    def run(self) -> None:
        torch = pytest.importorskip("torch")
        net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        while not self.halt.is_set():
            opt.zero_grad()
            net(torch.randn(2, 4)).sum().backward()
            opt.step()
            self.steps += 1
            self.halt.wait(0.005)


@pytest.fixture
def trained_agent(make_agent) -> Iterator[object]:
    pytest.importorskip("torch")
    agent = make_agent()
    trainer = Trainer()
    trainer.start()
    wait_until(lambda: trainer.steps >= 3, 30, "the trainer never stepped")
    yield agent
    trainer.halt.set()
    trainer.join(10)


def _ask(agent, path_params: dict, route: routes.Route, **kw) -> httpx.Response:
    with httpx.Client(base_url=agent.url, timeout=60) as c:
        return c.request(route.method, route.url(**path_params), **kw)


def test_every_route_answers_exactly_its_bodys_wire_form(trained_agent):
    """The byte-compatibility check: each real answer, read with its class and written again,
    is the same JSON with the keys in the same order. A key the agent sends that the class
    does not carry, or carries as another type, fails here."""
    agent = trained_agent
    got: dict[routes.Route, dict] = {}

    def ask(route: routes.Route, *, ids: dict | None = None, **kw) -> dict:
        r = _ask(agent, ids or {}, route, **kw)
        assert r.status_code == 200, (route.key, r.text)
        got[route] = r.json()
        return got[route]

    # GIVEN a real agent on a training loop; WHEN every JSON route is asked
    ask(routes.HEALTH, params={"challenge": "abc"})
    ask(routes.INFO)
    ask(routes.RANKS)
    ask(routes.QUERY, json=QueryRequest("SELECT 42 AS n, 'x' AS s").to_wire())
    canned = next(q for q in ask(routes.QUERIES)["queries"] if set(q["params"]) <= {"last"})
    ask(routes.CANNED_QUERY, ids={"name": canned["name"]},
        json=CannedRequest({p: 5 for p in canned["params"]}).to_wire())
    done = ask(routes.EVAL, json=EvalRequest("print('hi')\n1 + 1").to_wire())
    ask(routes.EVAL_JOB, ids={"eval_id": done["id"]})
    # an eval that runs until it is cancelled: the POST answers once the cancel took
    spin = threading.Thread(target=_ask, args=(agent, {}, routes.EVAL), kwargs={
        "json": EvalRequest("import time\nwhile True:\n    time.sleep(0.01)").to_wire()})
    spin.start()
    running = wait_until(lambda: [e for e in ask(routes.EVALS)["evals"]
                                  if e["state"] == "running"], 30, "the eval never ran")
    ask(routes.CANCEL_EVAL, ids={"eval_id": running[0]["id"]})
    spin.join(30)
    ask(routes.BACKTRACE)
    ask(routes.COLLECTIVES)
    ask(routes.TRACE)
    ask(routes.SET_TRACE, json=TraceRequest("every:10").to_wire())
    ask(routes.DOCTOR)
    ask(routes.NUMERICS)
    ask(routes.SET_NUMERICS, json=NumericsRequest({"spike_factor": 10.0}).to_wire())
    assert ask(routes.DOCTOR_GRADS, params={"wait": 10})["checked"] is True
    ask(routes.MEMORY_TENSORS, params={"top": 3})
    step = ask(routes.STEP)["step"]
    ask(routes.SUBMIT_ACTION, json={"kind": "step-eval", "code": "1", "id": "c1"})
    assert ask(routes.ACTION, ids={"action_id": "c1"}, params={"wait": 30})["action"]["state"] \
        == "ok"
    ask(routes.SUBMIT_ACTION, json={"kind": "step-eval", "code": "1", "id": "later",
                                    "step": step + 10**6})
    ask(routes.CANCEL_ACTION, ids={"action_id": "later"})
    ask(routes.ACTIONS)
    ask(routes.RESUME, json=ResumeRequest("contract-test").to_wire())
    ask(routes.POSTMORTEM_NOW)
    ask(routes.SUBMIT_ACTION, json={"kind": "profile", "profile": {"steps": 1}, "id": "p1"})
    # the action becomes a profile window at the next step boundary: until then it is 404
    wait_until(lambda: _ask(agent, {"profile_id": "p1"}, routes.PROFILE).status_code == 200,
               30, "the profile action never opened its window")
    ask(routes.PROFILE, ids={"profile_id": "p1"}, params={"wait": 30})
    ask(routes.START_FLAME, json={"seconds": 0.2, "rate": 50, "sampler": "in-process",
                                  "id": "f1"})
    assert ask(routes.FLAME, ids={"flame_id": "f1"}, params={"wait": 30})["flame"]["state"] \
        == "done"
    # the watchdog's report goes over the private socket, as only the watchdog may send it
    with httpx.Client(transport=httpx.HTTPTransport(uds=agent.unix_path),
                      base_url="http://localhost", timeout=30) as c:
        r = c.post(routes.ACCESS_REFUSALS.path, headers={"x-probe-client": "watchdog"},
                   json=RefusalReport(({"client": "1.2.3.4:5", "what": "GET /v1/info",
                                        "reason": "token", "message": "401"},), 1).to_wire())
        assert r.status_code == 200, r.text
        got[routes.ACCESS_REFUSALS] = r.json()

    # THEN every JSON route was asked, and each answer is its class's wire form, key for key
    assert set(got) == set(routes.ROUTES) - NOT_JSON == set(BODY_OF)
    differ = {}
    for route, body in got.items():
        again = BODY_OF[route].from_wire(body).to_wire()
        if again != body or list(again) != list(body):
            differ[route.key] = {k: (body.get(k, "(absent)"), again.get(k, "(absent)"))
                                 for k in [*body, *again] if body.get(k) != again.get(k)
                                 or (k in body) != (k in again)} or (list(body), list(again))
    assert differ == {}, differ
    assert _ask(agent, {}, routes.METRICS).text.startswith("# HELP")


def test_an_error_answer_is_its_error_body(client):
    for r in (client.post("/v1/query", json={"sql": "SELCT 1"}),
              client.post("/v1/eval", json={"code": "1 / 0"}),
              client.get(routes.ACTION.url(action_id="nope")),
              client.post("/v1/eval", json={"code": 1})):
        body = r.json()
        again = ErrorBody.from_wire(body).to_wire()
        assert again == body and list(again) == list(body) and r.status_code == body["status"]


def test_the_routes_table_is_what_the_agent_serves():
    from probe_agent.serving.app import ROUTERS

    served = {f"{m} {r.path}" for module in ROUTERS for r in module.router.routes
              for m in r.methods}
    assert served == {r.key for r in routes.ROUTES}
