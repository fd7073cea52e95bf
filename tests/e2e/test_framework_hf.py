"""The Hugging Face Trainer as its users write it (issue 17): a tiny GPT-2 from a config,
gradient accumulation 2, a cosine schedule, on CPU (tests/programs/fw_hf_trainer.py).

One job for the whole file: the seed playbook verbatim (``optimizer``, ``model``,
``train_loader`` are the Trainer's, found by the framework layer), `probe lr --scale 0.5` still
holds 20 steps later (the Trainer's LambdaLR holds the AcceleratedOptimizer, not the optimizer
that steps), `probe checkpoint` loads back into a fresh Trainer, `probe steps` counts what
``state.global_step`` counts, `probe hang` finds none.
"""

from __future__ import annotations

import math

import pytest

from tests.e2e import framework_checks as fc
from tests.e2e.training import training_job

pytestmark = [pytest.mark.e2e, pytest.mark.frameworks]

PROGRAM = "fw_hf_trainer.py"
MAX_STEPS = 4000


def cosine(step: int) -> float:
    """transformers' cosine schedule without warmup, as a factor of the base LR."""
    return 0.5 * (1.0 + math.cos(math.pi * step / MAX_STEPS))


#: How long the module's job may take to start. The first test to use the job pays for it
#: inside its own timeout (pytest-timeout counts fixture setup): on a loaded machine a
#: 120 s budget shared by both ran out before the test began.
JOB_START_S = 120


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf")
    args = ("--log-dir", str(tmp / "log"), "--step-sleep", "0.05", "--max-steps", str(MAX_STEPS))
    with training_job(tmp, PROGRAM, args=args, env=fc.FRAMEWORK_ENV,
                      timeout=JOB_START_S) as (_, infos):
        yield infos[0]["url"].removeprefix("http://"), tmp


@pytest.mark.timeout(JOB_START_S + 120)
def test_seed_playbook_runs_verbatim(job):
    endpoint, tmp = job
    fc.seed_playbook(endpoint, PROGRAM, tmp / "seed.pt")


@pytest.mark.timeout(JOB_START_S + 120)
def test_lr_scale_holds_under_the_trainers_scheduler(job):
    endpoint, tmp = job
    fc.lr_scale_holds(endpoint, tmp / "log", cosine)


@pytest.mark.timeout(JOB_START_S + 180)
def test_checkpoint_loads_back_into_a_fresh_trainer(job):
    endpoint, tmp = job
    path = tmp / "ck.pt"
    verify = fc.verify_command(PROGRAM, "--verify-checkpoint", str(path),
                               "--max-steps", str(MAX_STEPS))
    rec = fc.checkpoint_loads_back(endpoint, path, tmp / "log", verify, "hf_trainer")
    assert rec["optimizer_steps"] == [rec["step"]]


@pytest.mark.timeout(JOB_START_S + 120)
def test_steps_agree_with_global_step_and_no_hang(job):
    endpoint, tmp = job
    fc.steps_agree(endpoint, tmp / "log")
    fc.no_hang(endpoint)


@pytest.mark.timeout(JOB_START_S + 120)
def test_tokens_come_from_input_ids(job):
    """The Trainer calls model(**batch): 4 sequences of 16 input_ids, 2 micro-batches."""
    endpoint, _ = job
    fc.tokens_from_inputs(endpoint, per_step=4 * 16 * 2, micro_batches=2)
