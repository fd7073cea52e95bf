"""Lightning as its users write it (issue 17): a LightningModule with ``self.net =
nn.Sequential(...)`` and a StepLR stepped every optimizer step, one process on CPU
(tests/programs/fw_lightning.py).

One job for the whole file: the seed playbook verbatim (``optimizer``, ``model``,
``train_loader`` are ``trainer.optimizers[0]``, ``trainer.lightning_module`` and
``trainer.train_dataloader``), `probe lr --scale 0.5` still holds 20 steps later, `probe
checkpoint` loads back into a fresh LightningModule and what its ``configure_optimizers``
makes, `probe steps` counts what ``trainer.global_step`` counts, `probe hang` finds none.
"""

from __future__ import annotations

import pytest

from tests.e2e import framework_checks as fc
from tests.e2e.training import training_job

pytestmark = [pytest.mark.e2e, pytest.mark.frameworks]

PROGRAM = "fw_lightning.py"


def step_lr(step: int) -> float:
    """StepLR(step_size=10, gamma=0.9) after ``step`` scheduler steps, as a factor."""
    return 0.9 ** (step // 10)


#: How long the module's job may take to start. The first test to use the job pays for it
#: inside its own timeout (pytest-timeout counts fixture setup): on a loaded machine a
#: 120 s budget shared by both ran out before the test began.
JOB_START_S = 120


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lightning")
    args = ("--log-dir", str(tmp / "log"), "--step-sleep", "0.05")
    with training_job(tmp, PROGRAM, args=args, env=fc.FRAMEWORK_ENV,
                      timeout=JOB_START_S) as (_, infos):
        yield infos[0]["url"].removeprefix("http://"), tmp


@pytest.mark.timeout(JOB_START_S + 120)
def test_seed_playbook_runs_verbatim(job):
    endpoint, tmp = job
    fc.seed_playbook(endpoint, PROGRAM, tmp / "seed.pt")


@pytest.mark.timeout(JOB_START_S + 120)
def test_lr_scale_holds_under_step_lr(job):
    endpoint, tmp = job
    fc.lr_scale_holds(endpoint, tmp / "log", step_lr)


@pytest.mark.timeout(JOB_START_S + 180)
def test_checkpoint_loads_back_into_a_fresh_module(job):
    endpoint, tmp = job
    path = tmp / "ck.pt"
    rec = fc.checkpoint_loads_back(endpoint, path, tmp / "log",
                                   fc.verify_command(PROGRAM, "--verify-checkpoint", str(path)),
                                   "lightning")
    assert rec["momentum_buffers"] == 6  # SGD momentum for every parameter of self.net


@pytest.mark.timeout(JOB_START_S + 120)
def test_steps_agree_with_global_step_and_no_hang(job):
    endpoint, tmp = job
    fc.steps_agree(endpoint, tmp / "log")
    fc.no_hang(endpoint)
