"""The FLOP meter's dispatch mode against torch.compile (probe_agent/collectors/flops.py).

Dynamo does not compile a frame while a plain dispatch mode is on the stack, and remembers it:
that frame ran eagerly for the rest of the process. Seen: with the agent loaded (tracing off),
a function compiled after a first eager step never compiled, and an agent stopped while it
measured a step left the mode on, so nothing compiled after it.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn


@pytest.fixture
def counters() -> Any:
    """dynamo's frame counters, cleared: the meter stands aside once any frame compiled."""
    import torch._dynamo

    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    yield counters
    torch._dynamo.reset()
    counters.clear()  # later tests' agents would take this process for a compiled job


def _mode() -> Any:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


def _loop() -> Any:
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()

    return step


def test_a_function_first_compiled_in_the_measured_step_compiles(make_agent, counters):
    # GIVEN an agent (tracing off: the meter measures the second step) and one eager step
    agent = make_agent(trace="off")
    step = _loop()
    step()
    assert type(_mode()).__name__ == "CompileSafeFlopCounterMode"
    # WHEN the job first calls a compiled function in the measured step, and again later
    f = torch.compile(lambda x: x.sin() + 1, backend="eager")
    f(torch.randn(3))
    step()
    f(torch.randn(3))
    step()
    # THEN it compiled once, runs compiled after the step, and the step is no measurement
    assert dict(counters["frames"]) == {"total": 1, "ok": 1}
    meter = agent.collectors.steps.throughput.meter.state()
    assert meter["flops"] is None and meter["measurements"] == 0, meter
    assert meter["skipped"] == "torch.compile in the process" and not meter["measuring"], meter
    assert _mode() is None


def test_an_agent_stopped_mid_measurement_on_this_thread_leaves_no_mode(make_agent, counters):
    import probe_agent

    make_agent(trace="off")
    step = _loop()
    step()
    assert _mode() is not None  # the second step is being measured
    probe_agent.stop()
    assert _mode() is None
    f = torch.compile(lambda x: x.cos() * 2, backend="eager")
    f(torch.randn(3))
    assert counters["frames"]["ok"] == 1


def test_an_agent_stopped_from_another_thread_leaves_the_mode_at_the_next_step(make_agent,
                                                                               counters):
    import probe_agent

    make_agent(trace="off")
    step = _loop()
    step()
    mode = _mode()
    assert mode is not None
    # WHEN the agent stops from another thread (an eval, `probe inject` detaching)
    stopper = threading.Thread(target=probe_agent.stop)
    stopper.start()
    stopper.join(30)
    # THEN only this thread can leave its mode: it does at its next optimizer step, and a
    # function compiled after that compiles
    assert _mode() is mode
    step()
    assert _mode() is None
    f = torch.compile(lambda x: x.tan() - 1, backend="eager")
    f(torch.randn(3))
    assert counters["frames"]["ok"] == 1
    from torch.optim import optimizer

    assert not optimizer._global_optimizer_post_hooks
