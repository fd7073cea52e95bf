"""Evals as jobs against a real agent: a runaway eval is stopped even when it swallows every
exception, `probe eval --cancel ID` stops one on request, and an eval that cannot be stopped
(blocked in a C call) says so with the step time it costs the job."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from probe_cli.main import main
from tests.integration.test_actions_agent import Trainer, trainer_running
from tests.support import wait_until

SWALLOWS = ("while True:\n"
            "    try:\n"
            "        sum(range(1000))\n"
            "    except:\n"
            "        pass\n")


def test_an_eval_that_swallows_the_timeout_is_still_stopped(make_agent: Any) -> None:
    """``while True: try: ... except: pass`` caught the one asynchronous exception and ran
    until the job ended."""
    agent = make_agent(eval_timeout_s=0.5)
    with httpx.Client(base_url=agent.url, timeout=30) as c:
        # WHEN the eval runs past PROBE_EVAL_TIMEOUT_S
        r = c.post("/v1/eval", json={"code": SWALLOWS, "id": "runaway"})
        # THEN it is stopped, and says so
        assert r.status_code == 408, r.text
        assert r.json()["id"] == "runaway" and r.json()["still_running"] is False, r.json()
        assert "was stopped" in r.json()["error"], r.json()
        job = c.get("/v1/evals/runaway", params={"wait": 5}).json()["eval"]
        assert job["state"] == "cancelled" and job["still_running"] is False, job
        # AND the next eval runs as usual
        assert c.post("/v1/eval", json={"code": "6*7"}).json()["result"] == "42"
    # (the fixture's teardown fails if the eval's thread still runs)


def test_probe_eval_cancel_stops_a_running_eval(make_agent: Any,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN an eval that would run for the whole timeout, swallowing exceptions
    agent = make_agent(eval_timeout_s=60)
    answers: list[httpx.Response] = []
    th = threading.Thread(target=lambda: answers.append(httpx.post(
        agent.url + "/v1/eval", json={"code": SWALLOWS, "id": "e7"}, timeout=90)))
    th.start()
    try:
        wait_until(lambda: httpx.get(agent.url + "/v1/evals/e7").status_code == 200, 30,
                   "the eval never started")
        # WHEN the operator cancels it by its id
        code = main([agent.url.removeprefix("http://"), "eval", "--cancel", "e7"])
        out, err = capsys.readouterr()
    finally:
        th.join(30)
    # THEN it stopped, the CLI says so, and the eval's own request ends with the reason
    assert code == 0, (out, err)
    assert "cancelled" in out and "e7" in out, out
    assert answers and answers[0].status_code == 400, answers
    assert "EvalCancelled" in answers[0].json()["error"], answers[0].json()
    # AND an unknown id is a 404 that says how to find them
    missing = httpx.delete(agent.url + "/v1/evals/nope")
    assert missing.status_code == 404 and "no eval nope" in missing.json()["error"]


@pytest.fixture
def trainer() -> Iterator[Trainer]:
    with trainer_running(free=True, check=False) as t:
        yield t


def test_an_eval_blocked_in_c_says_it_still_runs_and_what_it_costs(
    make_agent: Any, trainer: Trainer,
) -> None:
    agent = make_agent(eval_timeout_s=1.0)
    wait_until(lambda: trainer.steps > 30, 60, "the trainer did not step")
    with httpx.Client(base_url=agent.url, timeout=30) as c:
        # WHEN an eval blocked in one C call outlives its timeout
        r = c.post("/v1/eval", json={"code": "import time\ntime.sleep(4)", "id": "slow"})
        body = r.json()
        # THEN the answer says it still runs, how to cancel it, and its cost to the steps
        assert r.status_code == 408 and body["still_running"] is True, body
        assert "still running" in body["error"] and "probe eval --cancel slow" in body["error"]
        assert body["cost"]["window_steps"] > 0 and body["cost"]["before_steps"] > 0, body
        assert "ratio" in body["cost"], body
        # AND it ends on its own once the call returns
        job = c.get("/v1/evals/slow", params={"wait": 10}).json()["eval"]
        assert job["state"] in ("cancelled", "ok") and job["still_running"] is False, job


def test_the_eval_id_is_an_idempotency_key(make_agent):
    """A request sent again under the same id (a retry after a lost answer) is answered from
    the eval that ran, not run a second time; other code under a used id is still a 409."""
    import httpx

    agent = make_agent()
    code = ("import builtins\n"
            "builtins.probe_idem = getattr(builtins, 'probe_idem', 0) + 1\n"
            "builtins.probe_idem")
    with httpx.Client(base_url=agent.url, timeout=30) as c:
        first = c.post("/v1/eval", json={"code": code, "id": "idem1"})
        again = c.post("/v1/eval", json={"code": code, "id": "idem1"})
        other = c.post("/v1/eval", json={"code": "1", "id": "idem1"})
        runs = c.post("/v1/eval", json={"code": "import builtins; builtins.probe_idem"})
    assert first.json()["result"] == "1" and again.json()["result"] == "1", again.text
    assert other.status_code == 409, other.text
    assert runs.json()["result"] == "1"
