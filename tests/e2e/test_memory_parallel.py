"""Memory by kind under DDP and FSDP2 (issue 29): on 2 gloo ranks under torchrun, `probe memory`
reports the parameter, gradient and AdamW bytes each rank holds (FSDP2: its local shards),
equal to what the program itself counts, and the activations of the nanoGPT-style blocks."""

from __future__ import annotations

import json

import pytest

from tests.e2e.training import probe, training_job

pytestmark = [pytest.mark.e2e]

_MIB = 1 / 2**20


@pytest.mark.timeout(240)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_kinds_are_each_ranks_exact_local_bytes(tmp_path, parallel):
    # GIVEN a 2-rank job tracing every step
    with training_job(tmp_path, "memory_job.py", args=("--parallel", parallel),
                      nproc=2, env={"PROBE_TRACE": "on"}, timeout=180) as (_, infos):
        # WHEN probe --json memory asks every rank
        out = probe("-t", infos[0]["url"].removeprefix("http://"), "--json", "memory",
                    "--warmup", "0", timeout=120)
        assert out.returncode == 0, out.stderr
    bodies = {b["rank"]: b["breakdown"] for b in json.loads(out.stdout)}
    assert sorted(bodies) == [0, 1]
    for info in infos:
        bd = bodies[info["rank"]]
        # THEN each rank's kinds are what the program counted on that rank
        assert bd["parameters_mib"] == pytest.approx(info["params"] * _MIB, abs=1e-3), bd
        assert bd["gradients_mib"] == pytest.approx(info["grads"] * _MIB, abs=1e-3), bd
        assert bd["optimizer_mib"] == pytest.approx(info["optimizer"] * _MIB, abs=1e-3), bd
        # AND the activations come from the blocks: the attention of each saves the most
        assert bd["activations_mib"] > 0
        assert bd["top_activations"][0]["module"].endswith(".attn"), bd["top_activations"]
    if parallel == "fsdp2":
        # each rank holds about half the parameters, and the advice does not shard again
        total = sum(i["params"] for i in infos)
        assert all(i["params"] < 0.6 * total for i in infos)
        assert all(bodies[r]["sharded"] for r in bodies)
        assert not any(a["lever"] == "shard_optimizer" for a in bodies[0]["advice"])
    else:
        assert infos[0]["params"] == infos[1]["params"]
        # sharding the optimizer over the 2 DP ranks is offered when it saves the advice's
        # 1 MiB floor: optimizer bytes x (1 - 1/world)
        offered = any(a["lever"] == "shard_optimizer" for a in bodies[0]["advice"])
        assert offered == (infos[0]["optimizer"] * (1 - 1 / len(infos)) * _MIB >= 1.0), (
            bodies[0]["advice"])
