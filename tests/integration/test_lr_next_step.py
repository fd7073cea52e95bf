"""`probe lr` with no scheduler to simulate (issue 17): the agent looks at the next step and
says whether the change held, because a loop that sets the LR itself every iteration (nanoGPT's
``get_lr``) puts its own value back before that step runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

torch = pytest.importorskip("torch")


class Loop:
    """A loop on its own thread, one step per ``go``; ``own_lr`` sets the LR each iteration."""

    def __init__(self, own_lr: bool) -> None:
        self.own_lr = own_lr
        self.go = threading.Semaphore(0)
        self.stop = threading.Event()
        self.done = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        net = torch.nn.Linear(4, 1)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        try:
            while not self.stop.is_set():
                if not self.go.acquire(timeout=0.05):
                    continue
                if self.own_lr:
                    for g in opt.param_groups:
                        g["lr"] = 1e-3  # like nanoGPT: lr = get_lr(it) every iteration
                net(torch.randn(2, 4)).sum().backward()
                opt.step()
                opt.zero_grad()
                self.done += 1
        except BaseException as e:  # surfaced by the test
            self.error = e

    def step(self) -> None:
        n = self.done + 1
        self.go.release()
        while self.done < n and self.error is None:
            self.stop.wait(0.005)


@pytest.fixture(params=[True, False], ids=["loop-sets-lr", "lr-left-alone"])
def loop(request: pytest.FixtureRequest) -> Iterator[Loop]:
    lp = Loop(own_lr=request.param)
    th = threading.Thread(target=lp.run, name="loop", daemon=True)
    th.start()
    yield lp
    lp.stop.set()
    th.join(10)
    assert lp.error is None, lp.error


def test_the_next_step_says_whether_the_lr_held(client: httpx.Client, loop: Loop) -> None:
    # GIVEN a loop with no scheduler that has stepped
    loop.step()
    # WHEN the LR is halved at the next boundary
    r = client.post("/v1/actions", json={"kind": "lr", "scale": 0.5, "id": "half"})
    assert r.status_code == 200, r.text
    loop.step()
    a = client.get("/v1/actions/half", params={"wait": 5}).json()["action"]
    assert a["state"] == "ok", a
    assert a["data"]["watch_next_step"] is True and "next_step" not in a["data"]
    # THEN after one more step the action says whether that step ran with the new LR
    loop.step()
    nxt = client.get("/v1/actions/half").json()["action"]["data"]["next_step"]
    assert nxt["step"] == a["step"] + 1
    if loop.own_lr:
        assert nxt == {"step": nxt["step"], "held": False, "lrs": [1e-3]}
    else:
        assert nxt["held"] is True and nxt["lrs"] == [pytest.approx(5e-4)]
