"""A profile window's memory (profiling/memory.py) against a real in-process agent: it ends
itself when it would grow the process past its budget, and gives its memory back afterwards.

Before: `profile --steps 500 --record-shapes --with-stack` took a rank's RSS 425 -> 1122 MiB
and kept it (415 -> 2254 MiB here for 300 steps, 415 -> 609 MiB after 30)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import wait_until

torch = pytest.importorskip("torch")


class Loop:
    """Free-running training on a thread: an 8-layer MLP, SGD."""

    def __init__(self) -> None:
        self.steps = 0
        self.stop = threading.Event()

    def run(self) -> None:
        net = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        while not self.stop.is_set():
            opt.zero_grad()
            net(torch.randn(16, 64)).sum().backward()
            opt.step()
            self.steps += 1


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    th = threading.Thread(target=lp.run, name="trainer", daemon=True)
    th.start()
    yield lp
    lp.stop.set()
    th.join(10)


def run_window(agent: Any, loop: Loop, **options: object) -> dict:
    wait_until(lambda: loop.steps > 3, 30, "the loop did not step")
    with httpx.Client(base_url=agent.url, timeout=30) as c:
        def post() -> httpx.Response | None:
            r = c.post("/v1/actions", json={"kind": "profile", "profile": {
                "record_shapes": True, "with_stack": True, "max_seconds": 300, **options}})
            # the loop ran before the agent started: until the agent's own step hook has seen
            # a step, the action is refused with "retry then" (409 no-step-hook), as it says
            return None if r.status_code == 409 and "no-step-hook" in r.text else r

        r = wait_until(post, 30, "the agent never saw an optimizer step")
        assert r.status_code == 200, r.text
        pid = r.json()["action"]["id"]

        def finished() -> dict | None:
            # 404 until the action has started the window at the next step boundary
            w = c.get(f"/v1/profile/{pid}", params={"wait": 2}).json().get("profile")
            return w if w and w["state"] in ("done", "error") else None

        return wait_until(finished, 300, "the window never finished")


def test_a_window_gives_its_memory_back(make_agent: Any, loop: Loop) -> None:
    # WHEN a 12-step window with shapes and stacks has been recorded and written
    w = run_window(make_agent(), loop, steps=12, max_mb=4096)
    # THEN the process is back near where it started (it kept +194 MiB for 30 steps before)
    assert w["state"] == "done" and w["stopped_by"] == f"step {w['last_step']}", w
    rss = w["rss_mib"]
    assert rss["after"] - rss["start"] < 40, rss


def test_a_window_over_its_memory_budget_ends_itself_and_says_so(make_agent: Any,
                                                                   loop: Loop) -> None:
    # WHEN a window's budget is smaller than what its steps add
    w = run_window(make_agent(), loop, steps=200, max_steps=200, max_mb=1)
    # THEN it ended early, at a step boundary, saying why, and its trace was written
    assert w["state"] == "done", w
    assert w["stopped_by"].startswith("its memory budget"), w
    assert "max_mb=1" in w["stopped_by"], w
    assert len(w["step_spans"]) < 200 and w["trace_bytes"] > 0, w
