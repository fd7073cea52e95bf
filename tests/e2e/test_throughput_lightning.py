"""Throughput under Lightning: tokens come from the integer ``input_ids`` a LightningModule
feeds its net (keyword argument, dict batch, gradient accumulation 2), and the LR schedule's
end (a warmup+cosine LambdaLR ending at step 40) is checked against ``Trainer.max_steps`` (100):
the trap is named before the job gets there, by `probe throughput` and by doctor
(tests/programs/fw_lightning_tokens.py)."""

from __future__ import annotations

import json

import pytest

from tests.e2e import framework_checks as fc
from tests.e2e.training import probe, training_job

pytestmark = [pytest.mark.e2e, pytest.mark.frameworks]


@pytest.mark.timeout(300)
def test_lightning_tokens_from_input_ids_and_the_schedule_against_max_steps(tmp_path):
    env = {**fc.FRAMEWORK_ENV, "PROBE_TRACE": "every:2"}
    with training_job(tmp_path, "fw_lightning_tokens.py", env=env, timeout=180) as (_, infos):
        info = infos[0]
        out = probe("-t", info["url"].removeprefix("http://"), "--json", "throughput",
                    "--last", "10", timeout=120)
        doctor = probe("-t", info["url"].removeprefix("http://"), "--json", "doctor",
                       timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    [body] = json.loads(out.stdout)
    t, job = body["throughput"], body["job"]
    per_step = info["batch"] * info["context"] * info["accum"]
    # THEN tokens per optimizer step are B x T of input_ids over the 2 micro-batches
    assert t["tokens"] == per_step and t["micro_batches"] == info["accum"], t
    assert t["context_len"] == info["context"] and job["gb_tok"] == per_step, (t, job)
    # AND the schedule is measured and set against Lightning's max_steps
    [s] = job["schedule"]
    assert s["method"] == "measured" and s["framework"] == "lightning", s
    assert (s["warmup_steps"], s["end_step"]) == (info["warmup"], info["sched_total"]), s
    assert (s["total_steps"], s["total_source"]) == (info["max_steps"], "Trainer.max_steps"), s
    assert s["total_tokens"] == info["max_steps"] * per_step, s
    n = info["max_steps"] - info["sched_total"]
    assert s["check"].startswith(
        f"the schedule ends at step {info['sched_total']} but the job runs to step "
        f"{info['max_steps']} (Trainer.max_steps): its last {n} steps ({n * per_step:,} tokens)"), s
    # AND doctor says the same as an info finding
    [f] = [f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "schedule"]
    assert f["severity"] == "info" and f["title"] == "LR SCHEDULE: " + s["check"], f
