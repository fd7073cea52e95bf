"""`probe slow` and `probe doctor` name the same slow layer, by its full path, under the HF
Trainer (gradient accumulation 2, GPT-2 blocks with their own ``__call__``) and Lightning (the
LightningModule is never called, its ``self.net`` is) and FSDP2 (``fully_shard`` blocks on 2
gloo ranks: their pre/post-forward hooks all-gather inside the module's call) (issue 17, item
3).

Each job makes one layer's forward sleep 20 ms (``--slow-module``), traces every step, and is
asked once it has run a few traced optimizer steps.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e import framework_checks as fc
from tests.e2e.training import probe, training_job

pytestmark = [pytest.mark.e2e, pytest.mark.frameworks]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("program", "slow_module", "nproc", "calls"), [
    ("fw_hf_trainer.py", "transformer.h.1.mlp", 0, 2),  # gradient_accumulation_steps=2
    ("fw_lightning.py", "net.2", 0, 1),
    ("fw_fsdp2.py", "layers.1.mlp", 2, 1),
], ids=["hf_trainer", "lightning", "fsdp2"])
def test_slow_and_doctor_name_the_same_layer_by_its_full_path(tmp_path, program, slow_module,
                                                              nproc, calls):
    # GIVEN a framework job whose one layer sleeps 80 ms per forward, traced every step (at a
    # load of 30 on 2 cores, FSDP2's collective waits in backward outweighed a 20 ms sleep)
    env = {**fc.FRAMEWORK_ENV, "PROBE_TRACE": "on"}
    args = ("--log-dir", str(tmp_path / "log"), "--slow-module", slow_module, "--slow-ms", "80")
    with training_job(tmp_path, program, args=args, nproc=nproc, env=env,
                      timeout=120) as (_, infos):
        endpoint = infos[0]["url"].removeprefix("http://")
        start = max(fc.read_log(tmp_path / "log"), default=0)
        fc.wait_for_step(tmp_path / "log", start + 5, ranks=max(nproc, 1))
        # WHEN the operator asks probe slow and probe doctor
        slow = fc.ok(probe("-t", endpoint, "--json", "slow", "--last", "5"))
        doctor = fc.ok(probe("-t", endpoint, "doctor"))
    # THEN probe slow ranks the slow layer first on every rank, by its full path in the model
    bodies = json.loads(slow.stdout)
    assert len(bodies) == max(nproc, 1), bodies
    for body in bodies:
        top = [dict(zip(body["columns"], r)) for r in body["rows"]]
        assert top[0]["module"] == slow_module, top[:3]
        assert top[0]["calls_per_step"] == calls, top[0]  # calls per optimizer step
        assert top[0]["fwd_self_ms"] >= 60 * calls, top[0]
        # AND self time is never negative nor more than the module's own time
        for r in top:
            assert 0 <= r["fwd_self_ms"] <= r["fwd_ms"] + 1e-3, r
            assert 0 <= r["bwd_self_ms"] <= r["bwd_ms"] + 1e-3, r
        # AND FSDP2's generated classes (FSDPNet) are named as the user wrote them
        assert not [r for r in top if r["module"].startswith("FSDP")], top
    # AND probe doctor names the same layer first
    assert f"slowest modules: {slow_module} first" in doctor.stdout, doctor.stdout
