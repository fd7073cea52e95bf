"""DeepSpeed as its users run it: ``deepspeed.initialize`` on 2 gloo ranks (its CPU accelerator),
ZeRO-3 (under torchrun) and ZeRO-2 (under ``deepspeed --num_gpus 2``: its launcher processes get
no agent, its ranks do), gradient accumulation 2, DeepSpeed's own WarmupDecayLR
(tests/programs/fw_deepspeed.py: the engine is called ``engine``; no ``model``, ``optimizer`` or
``scheduler`` in the script).

One job per ZeRO stage, shared by every check (the hang last: it never ends):

- names: ``model``, ``optimizer``, ``scheduler``, ``trainer`` are the engine's module, its torch
  optimizer, its DeepSpeed scheduler and the engine; ``eval --next-step`` runs after
  ``engine.step()`` advanced ``global_steps``; `probe steps` agrees with ``global_steps``;
- `probe lr --scale 0.5` holds through WarmupDecayLR, 5 steps later, on both ranks;
- `probe checkpoint`: the consolidated fp32 weights load strictly into a fresh ``GPT`` and equal
  the engine's full weights after step N; the optimizer state is DeepSpeed's own sharded
  checkpoint, one partition per rank;
- `probe slow` names modules from ``engine.module`` (``h.1.mlp``, not ``module.h.1.mlp``), and
  files the slow layer's time under its name;
- `probe doctor` on the healthy job: no problem (but the host time of the program's own sleep),
  and it knows DeepSpeed clips;
- `probe hang` names rank 1, the collective rank 0 waits in, and where each is (the user's code,
  not ``typing_extensions.py`` or DeepSpeed's comm layer).

Skipped without the deepspeed package. DeepSpeed builds a shared-memory comm op the first time
it starts on a machine (25-40 s, cached in ~/.cache/torch_extensions): the first job's readiness
wait allows for it.
"""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import sys
from pathlib import Path

import pytest

from tests.e2e import framework_checks as fc
from tests.e2e.training import probe, training_job
from tests.support import wait_until

pytestmark = [
    pytest.mark.e2e, pytest.mark.frameworks, pytest.mark.deepspeed,
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                       reason="the deepspeed package is not installed"),
]

PROGRAM = "fw_deepspeed.py"
LR, WARMUP, TOTAL = 1e-3, 10, 100_000  # the program's WarmupDecayLR
DS_ENV = {**fc.FRAMEWORK_ENV, "DS_ACCELERATOR": "cpu", "PROBE_TRACE": "on"}
GPT_MODULES = {"GPT", "wte", "head", *(f"h.{i}{sub}" for i in range(2) for sub in (
    "", ".attn", ".mlp", ".mlp.0", ".mlp.1", ".mlp.2"))}
#: The first collective of a step, which rank 0 waits in while rank 1 hangs before it.
FIRST_COLLECTIVE = {3: "all_gather", 2: "all_reduce"}  # ZeRO-2 all-reduces its buckets


def warmup_decay(step: int) -> float:
    """The LR logged after global_step ``step``: WarmupDecayLR after ``step`` scheduler steps
    (its last_batch_iteration is step - 1), linear warmup from LR/10 to LR, then linear decay."""
    i = step - 1
    gamma = i / WARMUP if i < WARMUP else max(0.0, (TOTAL - i) / (TOTAL - WARMUP))
    return LR / 10 + (LR - LR / 10) * gamma


def deepspeed_launcher() -> list[str]:
    """``deepspeed --num_gpus 2`` (one node: no hostfile, no ssh) on a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", "2",
            "--master_port", str(port)]


@pytest.fixture(scope="module", params=[3, 2], ids=["zero3", "zero2"])
def job(request, tmp_path_factory):
    """ZeRO-3 under torchrun; ZeRO-2 under DeepSpeed's own launcher."""
    stage = request.param
    tmp = tmp_path_factory.mktemp(f"zero{stage}")
    args = ("--stage", str(stage), "--accum", "2", "--log-dir", str(tmp / "log"),
            "--step-sleep", "0.05", "--slow-module", "h.1.mlp", "--slow-ms", "15",
            "--hang-file", str(tmp / "hang"))
    launcher = deepspeed_launcher() if stage == 2 else None
    with training_job(tmp, PROGRAM, args=args, nproc=2, env=DS_ENV, timeout=300,
                      launcher=launcher) as (proc, infos):
        yield infos[0]["url"].removeprefix("http://"), tmp, stage, (proc.pid, infos)


#: Per-rank answer timeout of this file's own commands: on a loaded 2-core machine the first
#: discovery (a gc scan) of a rank took more than the CLI's default 5 s.
SLOW_MACHINE = ("--timeout", "60")


def evals(endpoint: str, *args: str) -> list[str]:
    out = fc.ok(probe("-t", endpoint, *SLOW_MACHINE, "--json", "eval", *args, timeout=120))
    return [r["result"] for r in sorted(json.loads(out.stdout), key=lambda r: r["rank"])]


@pytest.mark.timeout(180)
def test_playbook_names_are_the_engines_objects(job):
    endpoint, tmp, _, _ = job
    names = "type(model).__name__, type(optimizer).__name__, type(scheduler).__name__, " \
            "type(trainer).__name__"
    assert evals(endpoint, names) == [repr(("GPT", "AdamW", "WarmupDecayLR",
                                            "DeepSpeedEngine"))] * 2
    # the boundary is DeepSpeed's: after engine.step() advanced global_steps
    assert evals(endpoint, "--next-step", "engine.global_steps == probe_step") == ["True"] * 2
    fc.steps_agree(endpoint, tmp / "log", ranks=2)


def test_only_the_ranks_have_agents(job):
    """Under ``deepspeed --num_gpus 2`` its runner and launch.py start the ranks: they get no
    agent, each rank has one (the run dir holds one ``<pid>.json`` per agent)."""
    _, tmp, _, (launcher_pid, infos) = job
    agents = {int(p.stem) for p in (tmp / "run").glob("*.json") if p.stem.isdigit()}
    assert agents == {i["pid"] for i in infos}, (agents, infos)
    assert launcher_pid not in agents


@pytest.mark.timeout(180)
def test_lr_scale_holds_through_warmup_decay(job):
    endpoint, tmp, _, _ = job
    fc.lr_scale_holds(endpoint, tmp / "log", warmup_decay, ranks=2, later=5)


@pytest.mark.timeout(240)
def test_checkpoint_loads_strictly_and_holds_the_engines_weights(job):
    endpoint, tmp, stage, _ = job
    path = tmp / "ck.pt"
    out = fc.ok(probe("-t", endpoint, *SLOW_MACHINE, "--json", "checkpoint", str(path),
                      timeout=180))
    results = json.loads(out.stdout)
    n = results[0]["step"]
    data = results[0]["data"]
    assert data["mode"] == f"deepspeed ZeRO-{stage}", data
    assert set(data["written"]) == {"model", "optimizer", "scheduler"}, data
    assert "zero_to_fp32.py" in data["written"]["optimizer"]
    # DeepSpeed's own sharded optimizer checkpoint (never rank 0's partition alone), and
    # weights that load without DeepSpeed and are the engine's after step N
    rec = fc.deepspeed_checkpoint_loads(PROGRAM, path, tmp / "log", n, "deepspeed", DS_ENV)
    assert rec["scheduler_last_batch_iteration"] == n - 1  # stepped by engine.step() N times


@pytest.mark.timeout(180)
def test_memory_counts_the_models_parameters_and_the_master_partition_as_optimizer(job):
    """ZeRO-1/2 shard gradients and optimizer state, not parameters: every rank holds the whole
    model; the flat fp32 partition the torch optimizer steps is a master copy (optimizer
    state). ZeRO-3: a rank holds its parameters' partitions (``ds_tensor``)."""
    endpoint, _, stage, _ = job
    held = "p.ds_tensor" if stage == 3 else "p"
    [want] = set(evals(endpoint, f"sum({held}.numel() * {held}.element_size() "
                                 "for p in model.parameters())"))
    state = ("sum(t.numel() * t.element_size() for s in optimizer.state.values() "
             "for t in s.values()) + sum(p.numel() * p.element_size() "
             "for g in optimizer.param_groups for p in g['params'])")
    opt_bytes = [int(x) for x in evals(endpoint, state)]
    out = fc.ok(probe("-t", endpoint, *SLOW_MACHINE, "--json", "memory", "--warmup", "0",
                      timeout=120))
    bodies = sorted(json.loads(out.stdout), key=lambda b: b["rank"])
    # the model's bytes (were model + partition under ZeRO-2, x1.5 here; the partition alone
    # when no root module was seen)
    assert [b["breakdown"]["bytes"]["parameters"] for b in bodies] == [int(want)] * 2, bodies
    assert [b["breakdown"]["bytes"]["optimizer"] for b in bodies] == opt_bytes, bodies


@pytest.mark.timeout(180)
def test_slow_names_modules_from_the_engines_module(job):
    endpoint, _, _, _ = job

    def slow_rows():
        out = probe("-t", endpoint, *SLOW_MACHINE, "--json", "slow", timeout=120)
        if out.returncode != 0:
            return None
        rows = []
        for r in json.loads(out.stdout):
            t = r.get("table") or r
            if t.get("columns") and t.get("rows"):
                rows += [dict(zip(t["columns"], row)) for row in t["rows"]]
        return rows or None

    rows = wait_until(slow_rows, 90, "probe slow had no traced steps")
    modules = {row["module"] for row in rows}
    # the model's own names (the engine's call is one row of its own, as DDP's is)
    assert modules <= GPT_MODULES | {"DeepSpeedEngine"}, modules
    assert "h.1.mlp" in modules
    # the 15 ms sleep before each of its 2 calls a step is filed under h.1.mlp (not which
    # module ranks first: on a loaded 2-core machine a Linear's wall time can exceed it)
    slow = [row for row in rows if row["module"] == "h.1.mlp"]
    assert all(row["fwd_self_ms"] >= 2 * 15 for row in slow), slow
    names = fc.ok(probe("-t", endpoint, *SLOW_MACHINE, "--json", "query",
                        "SELECT DISTINCT module, root FROM python.torch_trace", timeout=120))
    roots = {row[1] for r in json.loads(names.stdout) for row in r["rows"]}
    assert roots == {"GPT", "optimizer"}, roots  # the optimizer's step rows: "optimizer"


@pytest.mark.timeout(180)
def test_the_recorded_loss_is_the_one_given_to_engine_backward(job):
    # GIVEN the engine's loop (2 micro-batches per step) with nothing logged to the agent
    endpoint, tmp, _, _ = job
    fc.wait_for_step(tmp / "log", 6, ranks=2, timeout=150)  # run alone, the job has just begun
    out = fc.ok(probe("-t", endpoint, *SLOW_MACHINE, "--json", "query",
                      "SELECT step, loss, loss_source FROM python.steps ORDER BY step",
                      timeout=120))
    # THEN each step's loss is the mean of the losses the script gave engine.backward
    for body in json.loads(out.stdout):
        rank = body["rank"]
        own = {s: r["loss"] for s, r in fc.read_log(tmp / "log", rank).items() if "loss" in r}
        got = {s: (v, src) for s, v, src in body["rows"]}
        both = sorted(set(own) & set(got))[1:]  # the first: before the meter wrapped the engine
        assert len(both) >= 3, (rank, own, got)
        for s in both:
            assert got[s][0] == pytest.approx(own[s], rel=1e-5), (rank, s, got[s], own[s])
            assert got[s][1] == "deepspeed"


@pytest.mark.timeout(180)
def test_doctor_finds_the_healthy_job_healthy(job):
    endpoint, _, _, _ = job
    out = fc.ok(probe("-t", endpoint, *SLOW_MACHINE, "doctor", timeout=180))
    # The program sleeps 50 ms a step in its loop, outside every module, on purpose: doctor may
    # rightly call that host-bound. Nothing else is a problem.
    problems = re.findall(r"^\d+\. \[(?:warning|critical)\] (.*)$", out.stdout, re.M)
    assert all(p.startswith("LOW THROUGHPUT: host-bound") for p in problems), out.stdout
    assert "DeepSpeed clips gradients inside engine.step() (gradient_clipping=1" in out.stdout
    assert "clip_grad_norm_ not called" not in out.stdout


@pytest.mark.timeout(240)
def test_hang_names_the_collective_and_where_each_rank_is(job):
    """Last on its job: rank 1 never comes back."""
    endpoint, tmp, stage, _ = job
    (tmp / "hang").touch()

    def verdict():
        out = probe("-t", endpoint, *SLOW_MACHINE, "hang", timeout=120)
        return out if out.stdout.startswith("HANG") else None

    out = wait_until(verdict, 120, "probe hang never saw the hang")
    head = out.stdout.splitlines()[0]
    op = FIRST_COLLECTIVE[stage]
    assert head.startswith(f"HANG: rank 1 never reached {op} #"), out.stdout
    assert "it is in do_hang (fw_deepspeed.py:" in head, out.stdout
    waits = next(line for line in out.stdout.splitlines() if "rank 0 waits in" in line)
    assert f"rank 0 waits in {op} #" in waits and "at fw_deepspeed.py:" in waits, out.stdout
