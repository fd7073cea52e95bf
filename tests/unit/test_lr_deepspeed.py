"""`probe lr` on DeepSpeed's own schedulers (plain classes, not torch LRSchedulers): found among
the optimizers' schedulers, scaled so that every later LR is 0.1 x an unmodified run's, or
refused, with nothing changed, where the schedule keeps a value probe cannot scale."""

from __future__ import annotations

import importlib.util
import logging

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                reason="the deepspeed package is not installed")

K, AFTER = 6, 14


def schedulers() -> dict:
    from deepspeed.runtime import lr_schedules as L

    return {
        "WarmupLR": lambda o: L.WarmupLR(o, warmup_min_lr=0.01, warmup_max_lr=0.5,
                                         warmup_num_steps=10, warmup_type="linear"),
        "WarmupDecayLR": lambda o: L.WarmupDecayLR(o, total_num_steps=30, warmup_min_lr=0.01,
                                                   warmup_max_lr=0.5, warmup_num_steps=5),
        "WarmupCosineLR": lambda o: L.WarmupCosineLR(o, total_num_steps=30,
                                                     warmup_num_steps=4),
        "OneCycle": lambda o: L.OneCycle(o, cycle_min_lr=0.05, cycle_max_lr=0.5,
                                         cycle_first_step_size=4, decay_lr_rate=0.1,
                                         decay_step_size=2, cycle_momentum=False),
    }


def run(make, scale_at: int | None) -> list[float]:
    from probe_agent.actions.lr import change_lr
    from probe_agent.actions.objects import find_schedulers

    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.5)
    sched = make(opt)
    seen = []
    for step in range(1, K + AFTER + 1):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        if step == scale_at:
            found = find_schedulers([opt])
            assert found == [sched]  # discovered, though no torch LRScheduler
            report = change_lr([opt], found, scale=0.1)
            assert [s["holds"] for s in report["schedulers"]] == ["holds"], report
        sched.step()
    return seen


@pytest.fixture(autouse=True)
def quiet_deepspeed():
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)  # "before it has started" warnings


@pytest.mark.parametrize("name", ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle"])
def test_scaled_lr_survives_deepspeeds_schedulers(name: str) -> None:
    reference = run(schedulers()[name], None)
    changed = run(schedulers()[name], K)
    assert changed[:K] == reference[:K]
    assert changed[K:] == pytest.approx([0.1 * x for x in reference[K:]], rel=1e-9)


def test_lr_range_test_is_refused_with_nothing_changed() -> None:
    from deepspeed.runtime.lr_schedules import LRRangeTest

    from probe_agent.actions.lr import LRError, change_lr

    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.5)
    sched = LRRangeTest(opt, lr_range_test_min_lr=0.01, lr_range_test_step_size=2)
    for _ in range(3):
        opt.step()
        sched.step()
    before = opt.param_groups[0]["lr"]
    with pytest.raises(LRError, match="LRRangeTest .* computes the LR from values probe cannot"):
        change_lr([opt], [sched], scale=0.1)
    assert opt.param_groups[0]["lr"] == before
