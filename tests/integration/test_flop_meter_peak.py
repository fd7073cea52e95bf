"""The FLOP meter counts only the job's step (probe_agent/collectors/throughput.py): the CPU peak
probe (peak.py's square matmuls, ~0.3 s, once per node) runs at the same step boundary where
the meter enters its dispatch mode, and it must run before it. Seen from bench/gpu_gpt.py on CPU
with tracing on from the first step: python.steps' flops 6.5e9 where FlopCounterMode counts
8.8e7 for the same step (the probe's aten.mm counted as the job's), MFU inflated ~70x."""

from __future__ import annotations

import pytest

from tests.support import wait_until

torch = pytest.importorskip("torch")
nn = torch.nn


def test_the_measured_flops_are_the_steps_own_with_the_cpu_peak_probed(make_agent):
    from torch.utils.flop_counter import FlopCounterMode

    # GIVEN an agent tracing every step (the first traced boundary both probes the CPU peak,
    # its run dir being fresh, and starts the FLOP measurement) and a step of known FLOPs
    agent = make_agent(trace="on")
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 64)

    def step() -> None:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    counter = FlopCounterMode(display=False)
    with counter:
        model(x).sum().backward()
    opt.zero_grad()
    want = counter.get_total_flops()
    # WHEN the job steps past the measured step
    for _ in range(4):
        step()
    meter = agent.collectors.steps.throughput.meter
    wait_until(lambda: meter.flops is not None, 10, "no step was FLOP-measured")
    # THEN the meter counted that step's FLOPs, not the peak probe's matmuls
    assert meter.flops == want, (meter.flops, want)
    peak = agent.collectors.steps.throughput.peaks.get(torch, "cpu", "float32")
    assert peak is not None and peak[1].startswith("measured")
