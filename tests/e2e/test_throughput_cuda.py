"""On CUDA the step breakdown is GPU time: forward, backward and optimizer are CUDA-event spans
of the outermost modules, so "host" is the GPU's time outside them (idle while the host works,
or kernels outside modules). A token job that sleeps 30 ms on the host after each optimizer
step shows it as host time with the CUDA wording and next command.

Skipped without a GPU. NOT RUN ON A GPU when written (the machines it was written on had
none): the first CUDA run is its first real check."""

from __future__ import annotations

import json

import pytest

from tests.e2e.training import probe, training_job

# `cuda`: bench/gpu_check.py selects the CUDA tests by this marker (conftest skips it on CPU)
pytestmark = [pytest.mark.e2e, pytest.mark.cuda]

HOST_MS = 30.0


@pytest.mark.timeout(240)
def test_host_gaps_on_cuda_are_the_gpu_outside_the_model(tmp_path):
    # GIVEN one CUDA process whose every step sleeps 30 ms on the host, outside all modules
    args = ("--device", "cuda", "--host-ms", str(HOST_MS), "--batch", "16", "--context", "128",
            "--ready-step", "30")
    with training_job(tmp_path, "token_job.py", env={"PROBE_TRACE": "every:2"}, args=args,
                      timeout=180) as (_, infos):
        url = infos[0]["url"].removeprefix("http://")
        out = probe("-t", url, "--json", "throughput", "--last", "20", timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    [t] = [b["throughput"] for b in json.loads(out.stdout)]
    # THEN the job is seen on CUDA, and the host share holds at least the sleep (the GPU's
    # time outside the model's spans) while the GPU stage spans are a small rest
    assert t["on_cuda"] is True, t
    step_ms = t["step_ms"]
    assert t["host_share"] >= 0.8 * HOST_MS / step_ms, t
    assert t["host_share"] <= 1.0 and t["forward_share"] > 0, t
    # AND the lever says it with the CUDA wording and a GPU-timeline next step
    assert t["lever"]["lever"] == "host", t
    assert "GPU outside the model's kernels" in t["lever"]["evidence"], t
    assert t["lever"]["next"].startswith("probe profile"), t
