"""Doctor's LR is the one the last optimizer step used: a scheduler steps after the optimizer
(the HF Trainer: ``optimizer.step()`` then ``lr_scheduler.step()``), so a live read at step N
held step N's LR on one rank and step N+1's on another, and doctor said the ranks "disagree on
optimizer settings" on a healthy job (3 of 7 runs)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _groups(client) -> tuple[int, list[dict]]:  # noqa: ANN001 - httpx.Client
    body = client.get("/v1/doctor").json()
    return body["clock"]["step"], body["optimizers"][0]["groups"]


def test_lr_read_between_optimizer_and_scheduler_steps_is_the_steps_own(agent, client):
    # GIVEN a job whose LR scheduler decays the LR after every optimizer step
    assert agent.stepclock.poll()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        used = opt.param_groups[0]["lr"]
        # WHEN doctor reads a rank before its scheduler stepped, and another one after
        before = _groups(client)
        sched.step()
        after = _groups(client)
        # THEN both report the same step and the LR that step ran with
        assert before[0] == after[0]
        assert before[1][0]["lr"] == after[1][0]["lr"] == used
    # AND the value set since (the next step's) is kept apart, not lost
    assert after[1][0]["lr_live"] == opt.param_groups[0]["lr"] != used
