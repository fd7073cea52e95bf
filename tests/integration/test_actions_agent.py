"""Step-boundary actions against a real in-process agent (issue 6): the queue, its refusals,
failures, overruns, cancel, pause/resume, checkpoint discovery and the audit rows.

The "training thread" is a thread of the test calling ``optimizer.step()``; multi-rank
behaviour (agreement, --next-step across ranks) is in tests/e2e/test_actions.py.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import wait_until

torch = pytest.importorskip("torch")


class Trainer:
    """A tiny loop on its own thread; the model is a *local* of ``run`` (found via frames)."""

    def __init__(self) -> None:
        self.steps = 0
        self.stop = threading.Event()
        self.go = threading.Semaphore(0)
        self.thread_id: int | None = None
        self.error: BaseException | None = None

    def run(self, free: bool) -> None:
        torch.manual_seed(0)
        local_net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(local_net.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, 5)
        self.thread_id = threading.get_ident()
        try:
            while not self.stop.is_set():
                if not free and not self.go.acquire(timeout=0.05):
                    continue
                opt.zero_grad()
                local_net(torch.randn(2, 4)).sum().backward()
                opt.step()
                sched.step()
                self.steps += 1
                if free:
                    self.stop.wait(0.005)
        except BaseException as e:  # surfaced by the test
            self.error = e

    def step(self, n: int = 1) -> None:
        target = self.steps + n
        for _ in range(n):
            self.go.release()
        wait_until(lambda: self.steps >= target, 10, "trainer did not step")


@contextlib.contextmanager
def trainer_running(free: bool, check: bool = True) -> Iterator[Trainer]:
    """A Trainer stepping on its own thread (``free``: without waiting for ``go``); joined
    after, and with ``check`` its loop must not have raised."""
    t = Trainer()
    th = threading.Thread(target=t.run, args=(free,), name="trainer", daemon=True)
    th.start()
    yield t
    t.stop.set()
    th.join(10)
    if check:
        assert t.error is None, t.error


@pytest.fixture
def trainer(request: pytest.FixtureRequest) -> Iterator[Trainer]:
    with trainer_running(getattr(request, "param", False)) as t:
        yield t


def post(c: httpx.Client, **body: object) -> httpx.Response:
    return c.post("/v1/actions", json=body)


def test_refused_until_an_optimizer_has_stepped(client: httpx.Client, trainer: Trainer) -> None:
    # WHEN an action is queued before any optimizer step
    r = post(client, code="1")
    # THEN it is refused with the reason and what to do
    assert r.status_code == 409
    assert r.json()["reason"] == "no-step-hook"
    assert "no optimizer step seen on rank 0" in r.json()["error"]
    assert client.get("/v1/step").json()["step"] is None


def test_runs_on_the_training_thread_right_after_the_step(
    client: httpx.Client, trainer: Trainer
) -> None:
    trainer.step()
    # WHEN code is queued for the next step
    r = post(client, code="import threading\nprint('at', probe_step)\nthreading.get_ident()",
             id="a1")
    assert r.status_code == 200, r.text
    assert r.json()["action"]["step"] == 2
    trainer.step()
    # THEN it ran on the thread that called optimizer.step(), after step 2
    a = client.get("/v1/actions/a1", params={"wait": 5}).json()["action"]
    assert a["state"] == "ok", a
    assert a["stdout"] == "at 2\n" and a["result"] == str(trainer.thread_id)


def test_raising_code_is_reported_and_training_continues(
    client: httpx.Client, trainer: Trainer
) -> None:
    trainer.step()
    post(client, code="x = 1\nraise RuntimeError('nope')", id="bad")
    trainer.step(3)  # THEN the loop kept stepping (Trainer.error stays None)
    a = client.get("/v1/actions/bad").json()["action"]
    assert a["state"] == "error" and a["error"] == "RuntimeError: nope"
    assert 'File "<probe eval>", line 2' in a["traceback"]


def test_a_step_already_passed_is_refused_with_the_current_step(
    client: httpx.Client, trainer: Trainer
) -> None:
    trainer.step(3)
    r = post(client, code="1", step=3)
    assert r.status_code == 409
    body = r.json()
    assert body["reason"] == "past" and body["current_step"] == 3
    assert "already at step 3, past step 3" in body["error"]


def test_syntax_error_is_a_400_at_once(client: httpx.Client, trainer: Trainer) -> None:
    trainer.step()
    r = post(client, code="def (")
    assert r.status_code == 400 and "SyntaxError" in r.json()["error"]


def test_overrun_is_reported_not_interrupted(make_agent, trainer: Trainer) -> None:
    agent = make_agent(action_timeout_s=0.2)
    with httpx.Client(base_url=agent.url, timeout=10) as c:
        trainer.step()
        post(c, code="import time\ntime.sleep(0.6)\n'done'", id="slow")
        trainer.step()
        a = c.get("/v1/actions/slow", params={"wait": 5}).json()["action"]
        # THEN it finished (never interrupted) and says it overran the named limit
        assert a["state"] == "ok" and a["result"] == "'done'" and a["overran"] is True
        assert "PROBE_ACTION_TIMEOUT_S=0.2" in a["error"]
        wait_until(lambda: len(c.post("/v1/query", json={
            "sql": "SELECT 1 FROM python.audit WHERE action_id = 'slow'"}).json()["rows"]) == 3,
            5, "audit rows")
        rows = c.post("/v1/query", json={"sql": "SELECT outcome FROM python.audit WHERE "
                                                "action_id = 'slow' ORDER BY timestamp"})
        assert [r[0] for r in rows.json()["rows"]] == ["queued", "overrun", "ok"]


def test_cancel(client: httpx.Client, trainer: Trainer) -> None:
    trainer.step()
    post(client, code="1", step=100, id="later")
    # WHEN a queued action is cancelled
    r = client.delete("/v1/actions/later")
    # THEN it never runs
    assert r.status_code == 200 and r.json()["action"]["state"] == "cancelled"
    assert client.delete("/v1/actions/nope").status_code == 404
    listed = client.get("/v1/actions").json()
    assert listed["actions"][0]["state"] == "cancelled" and listed["step"] == 1


@pytest.mark.parametrize("trainer", [True], indirect=True, ids=["free-running"])
def test_pause_holds_the_loop_while_queries_and_actions_work(
    client: httpx.Client, trainer: Trainer
) -> None:
    wait_until(lambda: trainer.steps > 2, 10, "trainer did not start")
    # WHEN paused at the next step
    r = post(client, kind="pause", id="p")
    assert r.status_code == 200, r.text
    held = r.json()["action"]["step"]
    wait_until(lambda: client.get("/v1/step").json()["paused_at"] == held, 10, "not paused")
    # THEN the loop is held there, while eval, query and step-boundary actions still work
    assert trainer.steps == held - 1  # inside step `held`: after optimizer.step, before +1
    assert client.post("/v1/eval", json={"code": "1 + 1"}).json()["result"] == "2"
    assert client.post("/v1/query", json={"sql": "SELECT 42"}).json()["rows"] == [[42]]
    r = post(client, code="probe_step", id="while-held")  # next step = the held one
    assert r.json()["action"]["step"] == held
    a = client.get("/v1/actions/while-held", params={"wait": 5}).json()["action"]
    assert a["state"] == "ok" and a["result"] == str(held)
    assert trainer.steps == held - 1
    # WHEN resumed
    r = client.post("/v1/resume", json={"requested_by": "me@here"})
    assert r.json()["was_paused_at"] == held
    # THEN training goes on
    wait_until(lambda: trainer.steps > held + 2, 10, "training did not resume")


def test_checkpoint_finds_a_local_model_and_writes_atomically(
    client: httpx.Client, trainer: Trainer, tmp_path: Path
) -> None:
    trainer.step(2)
    path = tmp_path / "ck.pt"
    post(client, kind="checkpoint", path=str(path), id="ck")
    trainer.step()
    a = client.get("/v1/actions/ck", params={"wait": 10}).json()["action"]
    assert a["state"] == "ok", a
    # each object with the name the training code reaches it by (issue 17)
    assert a["data"]["names"] == {"model": ["local_net"], "optimizer": ["SGD (opt)"],
                                  "scheduler": ["StepLR (sched)"]}
    assert a["data"]["files"] == [{"path": str(path), "bytes": path.stat().st_size}]
    state = torch.load(path, weights_only=False)
    assert state["step"] == 3 and set(state) >= {"model", "optimizer", "scheduler", "rng"}
    assert list(tmp_path.iterdir()) == [path]


def test_lr_action_reports_before_and_after(client: httpx.Client, trainer: Trainer) -> None:
    trainer.step()
    post(client, kind="lr", set=0.05, id="lr")
    trainer.step()
    a = client.get("/v1/actions/lr", params={"wait": 5}).json()["action"]
    assert a["data"]["optimizers"][0]["groups"] == [{"before": 0.1, "after": 0.05}]
    assert a["data"]["schedulers"][0]["class"] == "StepLR"


def test_action_timeout_is_validated() -> None:
    from probe_agent.config import AgentConfig
    from probe_agent.errors import ConfigError

    with pytest.raises(ConfigError, match="PROBE_ACTION_TIMEOUT_S=0"):
        AgentConfig.from_env({"PROBE_ACTION_TIMEOUT_S": "0"})
