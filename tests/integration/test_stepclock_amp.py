"""The step clock counts the optimizer steps the AMP grad scaler skips (issue 17): the HF
Trainer's ``global_step`` and Lightning's ``global_step`` count them, so "step N" must too."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from probe_agent.clock import StepClock  # noqa: E402


def amp_steps(n: int, overflow_at: set[int]) -> tuple[torch.optim.Optimizer, list[int]]:
    """``n`` iterations of a plain AMP loop on CPU; the loss is inf at ``overflow_at``. Returns
    the optimizer and how many times its own step() ran."""
    import torch.optim.optimizer as optim_mod

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ran: list[int] = []
    handle = optim_mod.register_optimizer_step_post_hook(lambda *a: ran.append(1))
    scaler = torch.amp.GradScaler("cpu")
    try:
        for i in range(n):
            optimizer.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            if i in overflow_at:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    finally:
        handle.remove()
    return optimizer, ran


def test_skipped_amp_steps_are_counted_and_unwrapped_at_stop():
    original = torch.amp.GradScaler.step
    clock = StepClock()
    seen: list[int] = []
    clock.subscribe(lambda step, opt: seen.append(step))
    assert clock.poll()
    try:
        # WHEN the scaler skips iterations 0 and 3 of 6 (inf gradients)
        _, ran = amp_steps(6, {0, 3})
        # THEN the optimizer itself ran 4 times, and the clock counted all 6 iterations
        assert len(ran) == 4
        assert (clock.current_step, clock.skipped) == (6, 2)
        assert seen == [1, 2, 3, 4, 5, 6]
        assert clock.state()["skipped"] == 2
    finally:
        clock.stop()
    # AND stop() puts torch's own GradScaler.step back
    assert torch.amp.GradScaler.step is original


def test_steps_that_run_are_counted_once():
    clock = StepClock()
    assert clock.poll()
    try:
        amp_steps(3, set())
        assert (clock.current_step, clock.skipped) == (3, 0)
    finally:
        clock.stop()


@pytest.mark.parametrize("unscale", [False, True], ids=["clip-before-unscale", "unscale-first"])
def test_a_clip_of_scaled_gradients_is_recorded_with_the_scale(make_agent, unscale, tmp_path):
    """minGPT-ddp clips before ``scaler.unscale_``: the norm the clip sees is x65536. The agent
    records the scale beside the norm, so doctor reports the unscaled norm and the real bug."""
    import httpx

    from tests.support import wait_until

    agent = make_agent()
    wait_until(lambda: agent.stepclock.poll(), 10, "the step clock never armed")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    # GIVEN an AMP loop on CPU (bf16 autocast, scale 65536), clipping with or without unscale_
    for i in range(13):
        if i == 12:  # a checkpoint at the next step boundary
            with httpx.Client(base_url=agent.url) as c:
                assert c.post("/v1/actions", json={"kind": "checkpoint", "id": "ck", "path": str(
                    tmp_path / "ck.pt")}).status_code == 200
        agent.collectors.trainloop.install()
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(16, 8)).float().pow(2).mean()
        scaler.scale(loss).backward()
        if unscale:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    # WHEN doctor's loop query runs
    with httpx.Client(base_url=agent.url) as c:
        body = c.post("/v1/queries/doctor_loop", json={"params": {"last": 50}}).json()
        state = c.get("/v1/doctor").json()
    row = dict(zip(body["columns"], body["rows"][0]))
    # THEN the scaled clips are counted, and the unscaled norm is the real one (< 10)
    if unscale:
        assert row["scaled_clip_steps"] == 0 and row["grad_scale"] is None, row
        assert row["grad_norm_median"] < 10, row
    else:
        assert row["scaled_clip_steps"] >= 5 and row["grad_scale"] == 65536.0, row
        assert row["grad_norm_median"] > 1000 and row["unscaled_norm_median"] < 10, row
    # AND the doctor state says no LR scheduler steps this optimizer
    assert state["schedulers"] == [], state
    # AND the checkpoint holds the scaler's state, which loads into a fresh scaler
    with httpx.Client(base_url=agent.url) as c:
        a = c.get("/v1/actions/ck", params={"wait": 10}).json()["action"]
    assert a["state"] == "ok", a
    assert a["data"]["names"]["scaler"] == ["GradScaler"], a["data"]
    fresh = torch.amp.GradScaler("cpu")
    fresh.load_state_dict(torch.load(tmp_path / "ck.pt", weights_only=False)["scaler"])
    assert fresh.get_scale() == scaler.get_scale()
