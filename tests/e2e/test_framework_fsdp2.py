"""FSDP2 as torchtitan writes it (issue 17): ``fully_shard`` on each block then on the root, 2
gloo ranks under torchrun, AdamW on DTensor shards, a warmup-then-decay LambdaLR
(tests/programs/fw_fsdp2.py).

One job for the whole file: the seed playbook verbatim (``train_loader`` is the one DataLoader
the loop iterates, named ``dataloader`` there), `probe lr --scale 0.5` still holds 20 steps
later on both ranks, `probe checkpoint` writes a sharded torch.distributed.checkpoint that a
fresh 2-rank job loads back (each rank's shards equal the job's at that step), `probe steps`
counts what the loop counts, `probe hang` finds none. Last (it ruins the weights): a NaN born
in module ``norm`` on rank 1 (``--nan-file``) is named by `probe numerics` on FSDP2 too: the
ranks agree on the bad step and re-run its forward together.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from probe_cli.render.actions import dcp_load_hint
from tests.e2e import framework_checks as fc
from tests.e2e.training import probe, training_job
from tests.support import python_env, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.frameworks]

PROGRAM = "fw_fsdp2.py"
WARMUP, TOTAL = 5, 2000  # the program's schedule


def warmup_then_decay(step: int) -> float:
    if step < WARMUP:
        return (step + 1) / WARMUP
    return max(0.0, 1.0 - (step - WARMUP) / (TOTAL - WARMUP))


#: How long the module's job may take to start. The first test to use the job pays for it
#: inside its own timeout (pytest-timeout counts fixture setup): on a loaded machine a
#: 120 s budget shared by both ran out before the test began.
JOB_START_S = 120


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp2")
    args = ("--log-dir", str(tmp / "log"), "--step-sleep", "0.05", "--nan-file",
            str(tmp / "nan"))
    with training_job(tmp, PROGRAM, args=args, nproc=2, env=fc.FRAMEWORK_ENV,
                      timeout=JOB_START_S) as (_, infos):
        yield infos[0]["url"].removeprefix("http://"), tmp


@pytest.mark.timeout(JOB_START_S + 120)
def test_seed_playbook_runs_verbatim(job):
    endpoint, tmp = job
    fc.seed_playbook(endpoint, PROGRAM, tmp / "seed.pt", save_rank="0")


@pytest.mark.timeout(JOB_START_S + 120)
def test_lr_scale_holds_on_both_ranks(job):
    endpoint, tmp = job
    fc.lr_scale_holds(endpoint, tmp / "log", warmup_then_decay, ranks=2)


@pytest.mark.timeout(JOB_START_S + 180)
def test_sharded_checkpoint_loads_back_into_a_fresh_fsdp2_job(job):
    endpoint, tmp = job
    path = tmp / "ck"
    verify = fc.verify_command(PROGRAM, "--verify-checkpoint", str(path), nproc=2)
    # FSDP2 is no trainer: the plain loop's objects, with DTensor parameters (saved sharded)
    fc.checkpoint_loads_back(endpoint, path, tmp / "log", verify, "plain", ranks=2)
    assert (path / ".metadata").exists()
    # AND the text output says how to load the directory (it said nothing), and its one-file
    # command works: a torch.save file with the model, the optimizer and the step
    hint = dcp_load_hint(str(path))
    assert "torch.distributed.checkpoint.load(" in hint[0] and "set_state_dict(" in hint[0]
    cmd = hint[1].split(": ", 1)[1].replace("OUT.pt", str(tmp / "one.pt")).split()
    assert cmd[:3] == ["python", "-m", "torch.distributed.checkpoint.format_utils"], hint
    got = subprocess.run([sys.executable, *cmd[1:]], capture_output=True, text=True,
                         timeout=120, env=python_env())
    assert got.returncode == 0, got.stdout + got.stderr
    keys = subprocess.run([sys.executable, "-c", "import torch, sys; d = torch.load(sys.argv[1], "
                           "weights_only=False); print(sorted(d), d['step'])",
                           str(tmp / "one.pt")], capture_output=True, text=True, timeout=120)
    assert "'model', 'optimizer'" in keys.stdout, keys.stdout + keys.stderr


@pytest.mark.timeout(JOB_START_S + 120)
def test_steps_agree_with_the_loop_and_no_hang(job):
    endpoint, tmp = job
    fc.steps_agree(endpoint, tmp / "log", ranks=2)
    fc.no_hang(endpoint)


def rank_states(tmp) -> str:
    """Every rank's numerics state (its first non-finite step, whether the ranks agreed and
    why not: ``sharded``), read from each rank's own agent: the failure message."""
    out = []
    for info in sorted((tmp / "ready").glob("rank*.json")):
        url = json.loads(info.read_text())["url"]
        try:
            out.append(httpx.get(f"{url}/v1/numerics", timeout=30).json())
        except httpx.HTTPError as e:
            out.append({"url": url, "error": repr(e)})
    return json.dumps(out)[:8000]


@pytest.mark.timeout(JOB_START_S + 180)
def test_a_nan_born_on_one_rank_is_named_with_its_module_under_fsdp2(job):
    endpoint, tmp = job
    # WHEN rank 1's batch holds an all-zero sample: 0/0 in module 'norm' (UnitNorm)
    (tmp / "nan").touch()

    def named() -> dict | None:
        out = probe("-t", endpoint, "--json", "numerics")
        try:
            body = json.loads(out.stdout)
        except json.JSONDecodeError:
            return None
        return next((f for f in body.get("findings", []) if f["check"] == "nonfinite"
                     and "first at step" in f["title"]), None)

    wait_until(named, 150, "probe numerics never named the first NaN/Inf")
    nan = named()
    assert nan is not None
    # THEN both ranks re-ran the step's forward together: rank 1 produced it in 'norm', at
    # the sample that was zero; rank 0 received it (on failure: every rank's state, with its
    # first non-finite step and whether the ranks agreed: `sharded` says from when, or why not)
    assert nan["ranks"] == [1], (nan, rank_states(tmp))
    assert "on rank 1: produced in the forward of module 'norm' (UnitNorm)" in nan["title"], nan
    sample = (tmp / "nan.sample").read_text()
    assert f"sample(s) {sample} (dataloader indices" in nan["title"], (sample, nan["title"])
    assert any("rank 0" in e and "received" in e for e in nan["evidence"]), nan["evidence"]
    # AND the re-run left no rank behind in a collective: both go on stepping
    step = int(nan["title"].split("first at step ")[1].split()[0])
    fc.wait_for_step(tmp / "log", step + 3, ranks=2, timeout=60)
