"""Profile windows against a real in-process agent (issue 16): the wall-clock ceiling, the
refusal of a second profiler, the tracer's mode around a window, the ceilings' 400s.

The "training thread" is a thread of the test that steps only when told, so a test can stop
stepping in the middle of a window (a hung rank, or a CLI that died and will never ask again).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.support import python_env, wait_until

torch = pytest.importorskip("torch")


class Stepper:
    def __init__(self) -> None:
        self.steps = 0
        self.go = threading.Semaphore(0)
        self.stop = threading.Event()

    def run(self) -> None:
        net = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        while not self.stop.is_set():
            if not self.go.acquire(timeout=0.05):
                continue
            net(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            self.steps += 1

    def step(self, n: int = 1) -> None:
        target = self.steps + n
        for _ in range(n):
            self.go.release()
        wait_until(lambda: self.steps >= target, 10, "the stepper did not step")


@pytest.fixture
def stepper() -> Iterator[Stepper]:
    s = Stepper()
    th = threading.Thread(target=s.run, name="trainer", daemon=True)
    th.start()
    yield s
    s.stop.set()
    th.join(10)


def profile(client: httpx.Client, **options: object) -> httpx.Response:
    return client.post("/v1/actions", json={"kind": "profile", "profile": options})


def window(client: httpx.Client, profile_id: str, wait: float = 0) -> dict:
    return client.get(f"/v1/profile/{profile_id}", params={"wait": wait}).json()["profile"]


def test_the_ceiling_stops_a_window_whose_steps_never_come(make_agent, stepper):
    # GIVEN a profile of 5 steps with a 1 s ceiling, and training that stops after 1 step
    agent = make_agent(trace="on")
    client = httpx.Client(base_url=agent.url, timeout=10)
    stepper.step(3)
    r = profile(client, steps=5, max_seconds=1)
    assert r.status_code == 200, r.text
    pid = r.json()["action"]["id"]
    stepper.step(2)  # the window starts at the first boundary and records one more step
    assert window(client, pid)["state"] == "recording"
    assert client.get("/v1/trace").json()["mode"] == "off"  # the tracer pauses meanwhile
    # WHEN no step comes for longer than the ceiling
    wait_until(lambda: window(client, pid)["overdue"], 10, "the ceiling did not fire")
    # THEN the training thread stops the profiler at its very next module call (torch's
    # profiler belongs to the thread that started it), without waiting for step boundaries
    stepper.step(1)
    w = window(client, pid, wait=10)
    assert w["state"] == "done", w
    assert "ceiling" in w["stopped_by"] and len(w["step_spans"]) == 1, w
    assert not sys.modules["torch.autograd.profiler"]._is_profiler_enabled
    assert client.get("/v1/trace").json()["mode"] == "on"  # and the tracer's mode is back
    trace = client.get(f"/v1/profile/{pid}/trace")
    assert trace.status_code == 200 and "traceEvents" in json.loads(trace.content)
    # AND training goes on, and the next profile is accepted
    stepper.step(1)
    r = profile(client, steps=1)
    assert r.status_code == 200, r.text
    stepper.step(2)
    assert window(client, r.json()["action"]["id"], wait=10)["state"] == "done"
    rows = agent.store.query("SELECT outcome, code FROM python.audit WHERE kind = 'profile' "
                             "AND outcome = 'done'").rows
    assert len(rows) == 2 and "ceiling" in rows[0][1]
    client.close()


def test_a_second_profile_is_refused_while_one_records(make_agent, stepper):
    agent = make_agent()
    client = httpx.Client(base_url=agent.url, timeout=10)
    stepper.step(2)
    first = profile(client, steps=3).json()["action"]["id"]
    stepper.step(1)
    assert window(client, first)["state"] == "recording"
    # WHEN
    r = profile(client, steps=3)
    # THEN 409, nothing queued, and the first window completes as asked
    assert r.status_code == 409 and "already recording" in r.json()["error"], r.text
    stepper.step(3)
    w = window(client, first, wait=10)
    assert w["state"] == "done" and w["stopped_by"].startswith("step ")
    assert [s["step"] for s in w["step_spans"]] == [w["first_step"], w["first_step"] + 1,
                                                   w["first_step"] + 2]
    client.close()


@pytest.mark.parametrize("options, word", [
    ({"steps": 50}, "--max-steps 50"),
    ({"steps": 2, "max_steps": 5000}, "hard limit"),
    ({"steps": 0}, "whole number"),
    ({"steps": 2, "max_seconds": -1}, "max_seconds"),
], ids=["over-ceiling", "over-hard-limit", "zero-steps", "negative-seconds"])
def test_ceilings_and_bad_options_are_400s(agent, stepper, options, word):
    stepper.step(1)
    r = httpx.post(agent.url + "/v1/actions", json={"kind": "profile", "profile": options})
    assert r.status_code == 400 and word in r.json()["error"], r.text


ENDS_IN_A_WINDOW = """
import threading, torch, probe_agent
from probe_agent.config import AgentConfig
agent = probe_agent.start(AgentConfig(port=0, watchdog=False, run_dir={run_dir!r}))
net = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
def train():
    for i in range(5):
        net(torch.randn(4, 8)).sum().backward()
        opt.step()
        if i == 2:
            agent.actions.submit(kind="profile", step=None, code="", args={{"steps": 10}},
                                 client="t", requested_by=None, action_id="w", group=None)
    print("ended inside the window:", agent.actions.get("w").state, flush=True)
if {threaded}:
    t = threading.Thread(target=train)
    t.start()
    t.join()
else:
    train()
"""


@pytest.mark.parametrize("threaded", [False, True], ids=["main-thread", "training-thread"])
def test_a_program_that_ends_inside_a_window_exits_cleanly(tmp_path, threaded):
    """Exiting with torch's profiler on crashed the interpreter (SIGSEGV at exit)."""
    code = ENDS_IN_A_WINDOW.format(run_dir=str(tmp_path), threaded=threaded)
    res = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert "ended inside the window: ok" in res.stdout
