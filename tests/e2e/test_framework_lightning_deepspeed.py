"""Lightning's DeepSpeed strategy at ZeRO stage 3 (tests/programs/fw_lightning_deepspeed.py: 2
CPU processes on gloo through a subclass that skips Lightning's two CUDA-only checks, a test
harness, not a way to train): the same DeepSpeed adapter serves it. `probe checkpoint` gathers
ZeRO-3's partitions into weights that load strictly into a fresh LightningModule and equal the
job's after step N, with the StepLR's state and DeepSpeed's sharded optimizer checkpoint.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.e2e import framework_checks as fc
from tests.e2e.training import probe, training_job

pytestmark = [
    pytest.mark.e2e, pytest.mark.frameworks, pytest.mark.deepspeed,
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                       reason="the deepspeed package is not installed"),
]

PROGRAM = "fw_lightning_deepspeed.py"
DS_ENV = {**fc.FRAMEWORK_ENV, "DS_ACCELERATOR": "cpu"}


@pytest.mark.timeout(420)
def test_zero3_checkpoint_loads_into_a_fresh_lightning_module(tmp_path):
    args = ("--log-dir", str(tmp_path / "log"), "--step-sleep", "0.05")
    with training_job(tmp_path, PROGRAM, args=args, ranks=2, env=DS_ENV,
                      timeout=300) as (_, infos):
        endpoint = infos[0]["url"].removeprefix("http://")
        # GIVEN the playbook's names: the LightningModule, the torch optimizer, its StepLR
        names = fc.ok(probe("-t", endpoint, "--json", "eval",
                            "type(model).__name__, type(optimizer).__name__, "
                            "type(scheduler).__name__"))
        assert {r["result"] for r in json.loads(names.stdout)} == {
            repr(("Regressor", "AdamW", "StepLR"))}, names.stdout
        # WHEN a checkpoint is taken
        path = tmp_path / "ck.pt"
        out = fc.ok(probe("-t", endpoint, "--json", "checkpoint", str(path)))
        results = json.loads(out.stdout)
        n = results[0]["step"]
        assert results[0]["data"]["mode"] == "deepspeed ZeRO-3", results[0]["data"]
        # THEN it loads strictly into a fresh LightningModule, with the job's weights at step
        # N, the StepLR as the engine left it, and DeepSpeed's optimizer partitions
        rec = fc.deepspeed_checkpoint_loads(PROGRAM, path, tmp_path / "log", n, "lightning",
                                            DS_ENV)
        assert rec["scheduler"]["last_epoch"] == n - 1
