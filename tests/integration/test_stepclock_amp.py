"""The step clock counts the optimizer steps the AMP grad scaler skips (issue 17): the HF
Trainer's ``global_step`` and Lightning's ``global_step`` count them, so "step N" must too."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from probe_agent.actions.stepclock import StepClock  # noqa: E402


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
