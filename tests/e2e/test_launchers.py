"""Every rank gets an agent, whoever launched it; launchers and workers do not (issue 17).

- ``torch.multiprocessing.spawn``: the ranks have no RANK in their environment and start their
  agents at ``init_process_group``; the parent that spawned them stops its agent and shows as a
  launcher, so ``probe -t BASE`` reaches the real rank 0. DataLoader workers (spawned and
  forked) carry none.
- Lightning's own DDP launcher (``PROBE=1 python prog.py``; rank 1 is this script run again
  with LOCAL_RANK=1): both ranks carry agents, and `probe hang` names rank 1 in its callback.
- ``accelerate launch``: the accelerate process (which runs torch.distributed.run inside
  itself) carries no agent; its ranks do.
- The agent's step is the optimizer step, and agrees with the framework's own counter under
  gradient accumulation.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.e2e.test_cluster import free_base_port, hang_cli, wait_for_verdict
from tests.e2e.training import probe, training_job
from tests.support import PROGRAMS, kill_tree, python_env, wait_until

pytestmark = pytest.mark.e2e


def probe_json(*args: str) -> list[dict]:
    out = probe("--json", *args)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def both_ranks(target: str) -> list[dict]:
    """`probe -t target info` once both ranks answer, else [] (discovery takes a moment: until
    rank 1 has registered, the CLI reports it silent and exits 3, which is the truth)."""
    out = probe("--json", "-t", target, "info")
    assert out.returncode in (0, 3), out.stdout + out.stderr
    got = json.loads(out.stdout) if out.stdout.strip() else []
    return got if out.returncode == 0 and len(got) == 2 else []


def both_ranks_plain(run) -> bool:  # noqa: ANN001
    """Plain `probe --run-dir RUN info` (no -t) answered by ranks 0 and 1 of one job."""
    out = probe("--json", "--run-dir", str(run), "info")
    assert "jobs have agents" not in out.stderr, out.stderr
    return out.returncode == 0 and [g["rank"] for g in json.loads(out.stdout)] == [0, 1]


@pytest.mark.timeout(180)
def test_mp_spawn_ranks_carry_agents_and_the_parent_is_a_launcher(tmp_path):
    # GIVEN a 2-rank mp.spawn DDP job with PROBE=1 and a base port
    base = free_base_port(2)
    env = {"PROBE_PORT": str(base), "PROBE_TRACE": "off"}
    with training_job(tmp_path, "spawn_ddp.py", ranks=2, env=env) as (proc, infos):
        run = tmp_path / "run"
        ranks = {i["pid"]: i for i in infos}
        # THEN both real ranks (children of the launcher) listen on BASE + rank
        assert [i["parent_pid"] for i in infos] == [proc.pid, proc.pid]
        assert [i["url"] for i in infos] == [f"http://127.0.0.1:{base + r}" for r in (0, 1)]
        # AND only they carry an agent: not the launcher, not the DataLoader workers
        workers = {w for i in infos for w in i["worker_pids"]}
        assert len(workers) == 4
        assert {int(p.stem) for p in run.glob("*.sock")} == set(ranks)
        # AND `probe ps` tells the truth about each process
        rows = {r["pid"]: r for r in probe_json("--run-dir", str(run), "ps")}
        assert {p: (rows[p]["agent"], rows[p]["rank"]) for p in ranks} == {
            i["pid"]: ("answering", i["rank"]) for i in infos
        }
        assert (rows[proc.pid]["agent"], rows[proc.pid]["rank"]) == ("launcher", None)
        assert all(rows[w]["agent"] in ("injectable", "no") for w in workers if w in rows)

        # WHEN the operator asks the base port, as `probe launch --port BASE` users do
        got = wait_until(lambda: both_ranks(f"127.0.0.1:{base}"), 30,
                         "rank 1 not discovered through rank 0")
        # THEN the real ranks answer with their real ranks
        assert [(g["rank"], g["pid"], g["world_size"]) for g in got] == [
            (i["rank"], i["pid"], 2) for i in infos
        ]


@pytest.mark.frameworks
@pytest.mark.timeout(240)
def test_lightning_ddp_both_ranks_carry_agents_and_hang_names_the_callback(tmp_path):
    # GIVEN Lightning's own DDP launcher (rank 1 re-runs the script with LOCAL_RANK=1), rank 1
    # stuck in on_train_batch_end after 3 optimizer steps
    env = {"PROBE_POSTMORTEM_EVERY_S": "1"}
    with training_job(tmp_path, "lightning_ddp_stuck.py", ranks=2, timeout=150,
                      env=env) as (_, infos):
        # THEN both ranks carry an agent that knows its rank
        assert [(i["rank"], i["agent_rank"]) for i in infos] == [(0, 0), (1, 1)]
        assert all(i["url"] for i in infos)
        url = infos[0]["url"]
        # AND they are one job: the launcher is rank 0 itself and set the rendezvous in its
        # own environment after it started (its /proc environ has none), so plain `probe`
        # reaches both ranks (it refused: "2 jobs have agents ... say which one with -t")
        run = tmp_path / "run"
        wait_until(lambda: both_ranks_plain(run), 30, "plain `probe info` did not reach both")
        # AND their post-mortem copies share one job directory (they were two half-jobs,
        # each calling the other rank alive but silent after a crash)
        copies = lambda: sorted((p.parent.name, p.name) for p in run.glob("postmortem/*/rank-*"))  # noqa: E731
        wait_until(lambda: len({job for job, _ in copies()}) == 1 and len(copies()) == 2, 30,
                   "the ranks' post-mortem copies are not in one job directory")
        # AND rank 0, started with no RANK or WORLD_SIZE, took its identity from the group
        got = wait_until(lambda: both_ranks(url.removeprefix("http://")), 30,
                         "rank 1 not discovered through rank 0")
        assert [(g["rank"], g["pid"], g["world_size"]) for g in got] == [
            (i["rank"], i["pid"], 2) for i in infos
        ]
        wait_for_verdict(url, "wait_for_the_lock")
        # WHEN
        out = hang_cli(url)
    # THEN the verdict names rank 1 and where in the callback it is
    assert out.returncode == 4, out.stdout + out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("HANG: rank 1 never reached") and "1 rank waits for it" in first, \
        out.stdout
    assert "wait_for_the_lock (lightning_ddp_stuck.py:" in out.stdout, out.stdout
    assert "on_train_batch_end (lightning_ddp_stuck.py:" in out.stdout, out.stdout


@pytest.mark.frameworks
@pytest.mark.timeout(120)
def test_accelerate_launch_is_a_launcher_and_its_ranks_carry_agents(tmp_path):
    # GIVEN `accelerate launch` (torch.distributed.run inside the accelerate process), 2 CPU ranks
    ready, run = tmp_path / "ready", tmp_path / "run"
    ready.mkdir()
    env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(run), PROBE_WATCHDOG="0",
                     PROBE_TRACE="off", ACCELERATE_USE_CPU="1", HF_HOME=str(tmp_path / "hf"),
                     HF_HUB_OFFLINE="1")
    accelerate = [sys.executable, "-m", "accelerate.commands.launch"]
    if shutil.which("accelerate", path=os.path.dirname(sys.executable)):
        accelerate = [sys.executable, os.path.join(os.path.dirname(sys.executable), "accelerate"),
                      "launch"]  # the console script, as users type it
    proc = subprocess.Popen(
        [*accelerate, "--multi_gpu", "--num_processes=2", "--num_machines=1",
         "--mixed_precision=no", "--dynamo_backend=no", str(PROGRAMS / "accel_launch_ranks.py"),
         "--ready-dir", str(ready), "--run-dir", str(run)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=110)
    finally:
        kill_tree(proc.pid)
    assert proc.returncode == 0, output
    infos = [json.loads((ready / f"rank{r}.json").read_text()) for r in (0, 1)]
    # THEN both ranks (children of the accelerate process) carry an agent with their rank
    assert [i["parent_pid"] for i in infos] == [proc.pid, proc.pid]
    assert [(i["agent"]["rank"], i["agent"]["world_size"]) for i in infos] == [(0, 2), (1, 2)]
    # AND the accelerate process itself carried none
    assert infos[0]["agent_pids"] == sorted(i["pid"] for i in infos), output


@pytest.mark.timeout(60)
def test_a_deferred_process_starts_its_agent_when_it_joins_a_process_group(tmp_path):
    """A process below an agent with no rank of its own (a spawn child) carries no agent and
    has not imported torch at start-up; init_process_group starts one with the group's rank."""
    code = textwrap.dedent("""
        import json, socket, sys
        before = "torch" in sys.modules
        import torch, torch.distributed as dist
        from probe_agent.process import current
        after_import = current()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1)
        a = current()
        print(json.dumps({"torch_at_start": before, "agent_before": after_import is not None,
                          "rank": a.rank, "world": a.identity.world_size,
                          "wrapped": dist.init_process_group.__name__}))
        dist.destroy_process_group()
    """)
    env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(tmp_path / "run"),
                     PROBE_WATCHDOG="0", PROBE_TRACE="off", PROBE_AGENT_PID="1",
                     PROBE_AGENT_RANK="0:0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=50)
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"torch_at_start": False, "agent_before": False, "rank": 0, "world": 1,
                   "wrapped": "init_process_group"}, out.stderr


@pytest.mark.frameworks
@pytest.mark.timeout(120)
@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_step_is_the_framework_optimizer_step_under_gradient_accumulation(tmp_path, framework):
    # GIVEN 5 optimizer steps of 2 micro-batches each, under the framework's own loop
    out_file = tmp_path / "out.json"
    env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(tmp_path / "run"),
                     PROBE_WATCHDOG="0", PROBE_TRACE="off", HF_HUB_OFFLINE="1",
                     TRANSFORMERS_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, str(PROGRAMS / "fw_steps_check.py"), "--framework", framework,
         "--steps", "5", "--out", str(out_file)],
        env=env, capture_output=True, text=True, timeout=110, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out_file.read_text())
    # THEN after every micro-batch the agent's step equals the framework's counter
    assert len(got["seen"]) == 2 * got["framework_step"], got
    assert all(fw == clock for fw, clock in got["seen"]), got["seen"]
    # AND at the end the clock and python.steps stop where the framework stopped
    assert got["framework_step"] == 5
    assert got["clock_step"] == got["steps_max"] == got["framework_step"], got
    # AND python.steps.loss is the framework's own loss of each step (issue 40): the HF
    # Trainer's logged loss (training_step's values summed), Lightning's training_step mean
    own = {int(k): v for k, v in got["own_loss"].items()}
    assert sorted(own) == [1, 2, 3, 4, 5], own
    source = "hf_trainer" if framework == "hf" else "backward"
    for step, want in own.items():
        loss, src = got["loss"][str(step)]
        assert loss == pytest.approx(want, rel=1e-5) and src == source, (step, got["loss"], own)
