"""probe_agent.actions.lr: an LR change survives every supported scheduler's later steps (issue 6).

Each case runs a scheduler for K steps, scales the LR by 0.1 right after optimizer step K (as
the step-boundary action does), and checks every later LR against 0.1 x an unmodified run.
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
from torch.optim import lr_scheduler as ls  # noqa: E402

from probe_agent.actions.lr import LRError, change_lr  # noqa: E402

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
            from probe_agent.actions.objects import find_schedulers

            report = change_lr([opt], find_schedulers([opt]), scale=0.1)
            # each scheduler's next step was simulated and keeps the change (issue 17); a
            # container is checked through what it holds
            verdicts = {s["class"]: s["holds"] for s in report["schedulers"]}
            assert set(verdicts.values()) <= {"holds", "unchecked"}, report
            assert "holds" in verdicts.values() or set(verdicts) == {"OneCycleLR"}, report
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
    # (its next step was simulated before saying so: issue 17)
    assert report["schedulers"] == [{"class": "LambdaLR", "changed": ["base_lrs"],
                                     "holds": "holds",
                                     "notes": ["checked: its next step sets 0.005, 0.005"]}]
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
def test_an_lr_the_parameters_cannot_hold_is_refused_even_with_force(optim, dtype,
                                                                   kwargs) -> None:
    # GIVEN an optimizer whose step could not apply the requested LR to its parameters' dtype
    p = torch.nn.Parameter(torch.zeros(2, dtype=dtype))
    opt = optim([p], lr=0.5)
    sched = ls.StepLR(opt, step_size=3)
    # WHEN the LR change is forced past the 10x bound
    with pytest.raises(ValueError, match="refused.*nothing was changed"):
        change_lr([opt], [sched], force=True, **kwargs)
    # THEN the LR and the scheduler are as they were, and the next step still works
    assert opt.param_groups[0]["lr"] == 0.5 and sched.base_lrs == [0.5]
    p.grad = torch.ones_like(p)
    opt.step()
    assert torch.isfinite(p).all()


@pytest.mark.parametrize("kwargs, said", [
    ({"set_to": 1e30}, "lr --set 1e+30 refused: 2e+30x the current largest LR (0.5, Adam[0]), "
                       "above the 10x bound; pass --force"),
    ({"set_to": 5.01}, "lr --set 5.01 refused: 10x the current largest LR"),
    ({"scale": 10.5}, "lr --scale 10.5 refused: more than 10x the current LR; pass --force"),
    ({"set_to": 0.0}, "lr --set 0 refused: an LR of 0 stops training"),
    ({"scale": 0.0}, "lr --scale 0 refused: an LR of 0 stops training"),
], ids=["1e30", "just-above-10x", "scale-10.5", "set-0", "scale-0"])
def test_beyond_10x_or_zero_needs_force(kwargs, said) -> None:
    """`probe lr --set 1e30` made every parameter non-finite (issue 20): refused unless forced."""
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([p], lr=0.5)
    with pytest.raises(ValueError, match=re.escape(said)):
        change_lr([opt], [], **kwargs)
    assert opt.param_groups[0]["lr"] == 0.5
    # WHEN forced, it is the user's call (it fits float32 and Adam's step)
    change_lr([opt], [], force=True, **kwargs)
    p.grad = torch.ones_like(p)
    opt.step()
    assert opt.param_groups[0]["lr"] == kwargs.get("set_to", 0.5 * kwargs.get("scale", 1))


def test_the_bound_is_the_largest_lr_of_every_group() -> None:
    a = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.001)
    b = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    change_lr([a, b], [], set_to=1.0)  # 10x the larger one: allowed
    assert a.param_groups[0]["lr"] == b.param_groups[0]["lr"] == 1.0


@pytest.mark.parametrize("kwargs, said", [
    ({"set_to": float("nan")}, "finite number"),
    ({"scale": float("inf")}, "finite number"),
    ({"set_to": -1.0}, "cannot be negative"),
    ({"set_to": True}, "give a number, not bool"),
])
@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_a_non_finite_negative_or_boolean_lr_is_refused_even_with_force(kwargs, said,
                                                                        force) -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    with pytest.raises(ValueError, match=said):
        change_lr([opt], [], force=force, **kwargs)
    assert opt.param_groups[0]["lr"] == 0.5


class AbsoluteLR(ls.LRScheduler):
    """A scheduler that ignores base_lrs and the current LR: a fixed table of LRs."""

    def get_lr(self) -> list[float]:
        return [0.05 / (1 + self.last_epoch) for _ in self.optimizer.param_groups]


def test_a_scheduler_that_would_undo_the_change_is_refused_and_nothing_changes() -> None:
    # GIVEN a scheduler that computes absolute LRs from its own table
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.05)
    sched = AbsoluteLR(opt)
    opt.step()
    sched.step()
    lr, base = opt.param_groups[0]["lr"], list(sched.base_lrs)
    # WHEN the LR is halved
    with pytest.raises(LRError, match=r"refused: AbsoluteLR .* set the LR back to "
                                      r"0\.0166667\); nothing was changed"):
        change_lr([opt], [sched], scale=0.5)
    # THEN nothing changed: its next step gives what it would have given anyway
    assert opt.param_groups[0]["lr"] == lr and sched.base_lrs == base
    assert opt.param_groups[0]["initial_lr"] == 0.05
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 / 3)


def test_oncycle_past_its_end_is_reported_unchecked_not_refused() -> None:
    # GIVEN a OneCycleLR at its last step (one more step() would raise)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    sched = ls.OneCycleLR(opt, max_lr=1.0, total_steps=3)
    for _ in range(3):
        opt.step()
        sched.step()
    # WHEN the LR is halved THEN it is applied and the report says it could not be checked
    report = change_lr([opt], [sched], scale=0.5)
    assert report["schedulers"][0]["holds"] == "unchecked"
    assert report["schedulers"][0]["notes"] == ["its next step could not be simulated"]
