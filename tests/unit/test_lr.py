"""probe_agent.lr: an LR change survives every supported scheduler's later steps (issue 6).

Each case runs a scheduler for K steps, scales the LR by 0.1 right after optimizer step K (as
the step-boundary action does), and checks every later LR against 0.1 x an unmodified run.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch.optim import lr_scheduler as ls  # noqa: E402

from probe_agent.lr import change_lr  # noqa: E402

SCHEDULERS = {
    "StepLR": lambda o: ls.StepLR(o, step_size=3, gamma=0.5),
    "MultiStepLR": lambda o: ls.MultiStepLR(o, milestones=[4, 9], gamma=0.3),
    "ExponentialLR": lambda o: ls.ExponentialLR(o, gamma=0.9),
    "CosineAnnealingLR": lambda o: ls.CosineAnnealingLR(o, T_max=7, eta_min=0.01),
    "CosineAnnealingWarmRestarts": lambda o: ls.CosineAnnealingWarmRestarts(o, T_0=4, eta_min=0.01),
    "LambdaLR": lambda o: ls.LambdaLR(o, lambda e: 1.0 / (1 + e)),
    "MultiplicativeLR": lambda o: ls.MultiplicativeLR(o, lambda e: 0.95),
    "OneCycleLR": lambda o: ls.OneCycleLR(o, max_lr=1.0, total_steps=30),
    "CyclicLR": lambda o: ls.CyclicLR(o, base_lr=0.1, max_lr=1.0, step_size_up=3),
    "LinearLR": lambda o: ls.LinearLR(o, start_factor=0.2, total_iters=6),
    "ConstantLR": lambda o: ls.ConstantLR(o, factor=0.5, total_iters=6),
    "PolynomialLR": lambda o: ls.PolynomialLR(o, total_iters=20, power=2.0),
    "SequentialLR": lambda o: ls.SequentialLR(
        o, [ls.LinearLR(o, start_factor=0.5, total_iters=3), ls.ExponentialLR(o, gamma=0.9)],
        milestones=[5]),
}
K, AFTER = 6, 14


def run(make, scale_at: int | None) -> list[float]:
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.5, momentum=0.9)
    sched = make(opt)
    seen = []
    for step in range(1, K + AFTER + 1):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        if step == scale_at:
            from probe_agent.objects import find_schedulers

            change_lr([opt], find_schedulers([opt]), scale=0.1)
        sched.step()
    return seen


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_scaled_lr_survives_later_scheduler_steps(name: str) -> None:
    # GIVEN an unmodified run of the scheduler
    reference = run(SCHEDULERS[name], None)
    # WHEN the LR is scaled by 0.1 right after optimizer step K
    changed = run(SCHEDULERS[name], K)
    # THEN the steps up to K are untouched and every later LR is 0.1 x the reference
    assert changed[:K] == reference[:K]
    assert changed[K:] == pytest.approx([0.1 * x for x in reference[K:]], rel=1e-9)


def test_set_reports_before_and_after_per_group() -> None:
    # GIVEN two param groups with different LRs under a LambdaLR
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a], "lr": 0.2}, {"params": [b], "lr": 0.4}])
    sched = ls.LambdaLR(opt, lambda e: 0.5 ** e)
    # WHEN every LR is set to 0.01
    report = change_lr([opt], [sched], set_to=0.01)
    # THEN each group is 0.01, base LRs follow per group, and the report says what changed
    assert [g["lr"] for g in opt.param_groups] == [0.01, 0.01]
    assert sched.base_lrs == pytest.approx([0.01, 0.01])
    assert report["optimizers"][0]["groups"] == [{"before": 0.2, "after": 0.01},
                                                 {"before": 0.4, "after": 0.01}]
    assert report["schedulers"] == [{"class": "LambdaLR", "changed": ["base_lrs"], "notes": []}]
    opt.step()
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.005, 0.005])


def test_tensor_lr_is_updated_in_place() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([p], lr=torch.tensor(0.1))
    lr = opt.param_groups[0]["lr"]
    change_lr([opt], [], scale=0.5)
    assert opt.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.05)


@pytest.mark.parametrize("optim, dtype, kwargs", [
    (torch.optim.SGD, torch.float32, {"set_to": 1.7976931348623157e308}),  # what the fuzzer sent
    (torch.optim.SGD, torch.float16, {"set_to": 1e5}),  # above float16's 65504
    (torch.optim.SGD, torch.float32, {"scale": 1e300}),
    (torch.optim.Adam, torch.float32, {"set_to": 1e38}),  # fits float32; Adam's step does not
])
def test_an_lr_the_parameters_cannot_hold_is_refused_and_nothing_changes(optim, dtype,
                                                                       kwargs) -> None:
    # GIVEN an optimizer whose step could not apply the requested LR to its parameters' dtype
    p = torch.nn.Parameter(torch.zeros(2, dtype=dtype))
    opt = optim([p], lr=0.5)
    sched = ls.StepLR(opt, step_size=3)
    # WHEN the LR change is asked for
    with pytest.raises(ValueError, match="refused.*nothing was changed"):
        change_lr([opt], [sched], **kwargs)
    # THEN the LR and the scheduler are as they were, and the next step still works
    assert opt.param_groups[0]["lr"] == 0.5 and sched.base_lrs == [0.5]
    p.grad = torch.ones_like(p)
    opt.step()
    assert torch.isfinite(p).all()


def test_a_huge_but_applicable_lr_is_the_users_call() -> None:
    # 1e30 on float32 Adam poisons the weights but does not crash the loop: applied
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([p], lr=0.5)
    change_lr([opt], [], set_to=1e30)
    p.grad = torch.ones_like(p)
    opt.step()
    assert opt.param_groups[0]["lr"] == 1e30


@pytest.mark.parametrize("kwargs", [{"set_to": float("nan")}, {"scale": float("inf")},
                                    {"scale": 0.0}, {"set_to": -1.0}])
def test_a_non_finite_or_negative_lr_is_refused(kwargs) -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    with pytest.raises(ValueError, match="finite number"):
        change_lr([opt], [], **kwargs)
    assert opt.param_groups[0]["lr"] == 0.5
