"""Where an LR schedule's warmup and decay end, read from torch's schedulers and measured from a
LambdaLR's function, each against the LR the scheduler really produces when stepped."""

from __future__ import annotations

import math

import pytest
import torch

from probe_agent.collectors.schedule_read import describe


def opt() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)


def warmup_cosine(warmup: int, total: int):  # noqa: ANN201 - the usual hand-written lambda
    def f(step: int) -> float:
        if step < warmup:
            return step / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1 + math.cos(math.pi * progress)))
    return f


def lrs(s, n: int) -> list[float]:  # noqa: ANN001
    out = []
    for _ in range(n):
        out.append(s.optimizer.param_groups[0]["lr"])
        s.optimizer.step()
        s.step()
    return out


def test_a_hand_written_warmup_cosine_lambda_is_measured():
    # GIVEN a LambdaLR whose lambda warms up for 10 steps and decays to 0 at step 40
    s = torch.optim.lr_scheduler.LambdaLR(opt(), warmup_cosine(10, 40))
    d = describe(s)
    # THEN the measured ends are the steps at which the real LR peaks and bottoms out
    seen = lrs(s, 60)
    assert d["method"] == "measured" and d["scheduler"] == "LambdaLR(f)"
    assert d["warmup_steps"] == seen.index(max(seen)) == 10
    assert d["end_step"] == 10 + seen[10:].index(min(seen[10:])) == 40
    # AND past its end the cosine climbs again, as the scheduler's own LR does
    assert d["kind"] == "warmup+decay" and d["after_end"] == "rises" and seen[59] > seen[40]


def test_one_cycle_cosine_linear_and_sequential_are_read():
    d = describe(torch.optim.lr_scheduler.OneCycleLR(opt(), max_lr=1.0, total_steps=40,
                                                    pct_start=0.25))
    assert (d["warmup_steps"], d["end_step"], d["after_end"]) == (10, 40, "raises")
    d = describe(torch.optim.lr_scheduler.CosineAnnealingLR(opt(), T_max=40))
    assert (d["end_step"], d["after_end"], d["kind"]) == (40, "rises", "decay")
    o = opt()
    seq = torch.optim.lr_scheduler.SequentialLR(o, [
        torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=5),
        torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=30)], milestones=[5])
    d = describe(seq)
    assert d["scheduler"] == "SequentialLR(LinearLR, CosineAnnealingLR)"
    assert (d["warmup_steps"], d["end_step"], d["kind"]) == (5, 35, "warmup+decay")
    d = describe(torch.optim.lr_scheduler.StepLR(opt(), step_size=10))
    assert d["end_step"] is None and d["kind"] == "constant" and "without an end" in d["note"]


def test_a_lambda_that_raises_is_opaque_not_an_error():
    def bad(step: int) -> float:
        if step > 3:
            raise RuntimeError("reads a global the loop sets")
        return 1.0
    s = torch.optim.lr_scheduler.LambdaLR(opt(), bad)
    d = describe(s)
    assert d["method"] == "opaque" and "RuntimeError" in d["note"]


def test_hf_cosine_with_warmup_is_read_from_its_partial():
    get_cosine_schedule_with_warmup = pytest.importorskip(
        "transformers").get_cosine_schedule_with_warmup

    s = get_cosine_schedule_with_warmup(opt(), num_warmup_steps=10, num_training_steps=40)
    d = describe(s)
    assert d["method"] == "read" and (d["warmup_steps"], d["end_step"]) == (10, 40)
    assert d["after_end"] == "rises"  # HF's cosine climbs again past num_training_steps
