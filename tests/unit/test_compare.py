"""`probe compare`'s statistics and verdict, on samples whose answer is known."""

from __future__ import annotations

import random
import re

from probe_cli.diagnose.compare import RunEvidence, compare_runs
from probe_cli.diagnose.shift import shift


def test_shift_is_the_median_pairwise_difference_with_an_interval_around_it():
    a = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    b = [x + 5 for x in a]
    s = shift(a, b)
    assert s is not None and s.estimate == 5.0
    assert s.low is not None and s.high is not None and s.low <= 5.0 <= s.high
    # +5 on a median of 12.5, the interval +2 .. +8: surely beyond 16%, not surely beyond 20%
    assert s.excludes_zero and s.beyond(0.16) and not s.beyond(0.2)


def test_a_few_disturbed_steps_do_not_decide():
    rng = random.Random(1)
    a = [rng.gauss(50, 1) for _ in range(200)]
    b = [rng.gauss(50, 1) for _ in range(200)]
    b[::20] = [500.0] * len(b[::20])  # 10 steps disturbed tenfold (a probe command, a save)
    s = shift(a, b)
    assert s is not None and abs(s.estimate) < 1.0
    assert not s.beyond(0.05)


def test_too_few_values_give_an_estimate_without_an_interval():
    s = shift([1.0, 2.0], [3.0, 4.0])
    assert s is not None and s.low is None and not s.beyond(0.01)
    assert shift([], [1.0]) is None


def _run(label: str, step_ms: float, slow_module_ms: float, rng: random.Random) -> RunEvidence:
    run = RunEvidence(label=label, ranks=[0, 1])
    for step in range(1, 201):
        run.step_s[step] = (step_ms + rng.gauss(0, 0.5)) / 1e3
    traced = list(range(10, 201, 10))
    run.traced_steps = len(traced)
    run.modules[("layers.0", "forward")] = {s: (2 + rng.gauss(0, 0.05)) / 1e3 for s in traced}
    run.modules[("layers.1", "backward")] = {
        s: (slow_module_ms + rng.gauss(0, 0.05)) / 1e3 for s in traced}
    run.settings = {"world_size": 2, "micro_batches": 4}
    return run


def test_compare_names_the_slowed_module_first_and_stays_quiet_on_one_config():
    rng = random.Random(7)
    a, same, slowed = _run("A", 50, 5, rng), _run("A2", 50, 5, rng), _run("B", 56, 11, rng)
    slowed.settings["micro_batches"] = 2
    found = compare_runs(a, slowed)
    assert found.problem and re.match(r"REGRESSION: B's step is 1[12]\.\d% slower", found.headline)
    assert re.search(r"first: layers\.1 backward \+[56]\.\d+ ms", found.headline), found.headline
    assert found.modules[0].module == "layers.1" and 0.9 < (found.modules[0].share or 0) < 1.1
    assert ("micro_batches", 4, 2) in found.settings
    quiet = compare_runs(a, same)
    assert not quiet.problem and quiet.headline.startswith("no change beyond 5%")
    assert quiet.settings == []


def test_a_faster_run_is_an_improvement_that_slower_only_lets_pass():
    rng = random.Random(3)
    a, b = _run("A", 60, 11, rng), _run("B", 50, 5, rng)
    assert compare_runs(a, b).problem
    gate = compare_runs(a, b, slower_only=True)
    assert not gate.problem and gate.headline.startswith("IMPROVEMENT")


def test_a_busier_machine_in_one_run_is_said_beside_the_change():
    rng = random.Random(5)
    a, b = _run("A", 50, 5, rng), _run("B", 70, 5, rng)
    a.shares["cpu_wait_share"], b.shares["cpu_wait_share"] = 0.02, 0.30
    c = compare_runs(a, b)
    assert c.problem and "A waited for a CPU 2% of its step and B 30%" in c.headline
    assert ("cpu_wait_share", 0.02, 0.30) in c.shares
