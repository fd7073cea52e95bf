"""Step-boundary actions on a real 2-rank torchrun job (gloo, CPU): issue 6."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from probe_cli.main import main
from tests.e2e.training import probe, training_job
from tests.support import PROGRAMS, python_env, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

PROGRAM = "actions_train.py"


def logged(log_dir: Path, rank: int) -> list[dict]:
    path = log_dir / f"rank{rank}.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(x) for x in lines if x.endswith("}")]


def last_step(log_dir: Path, rank: int) -> int:
    rows = logged(log_dir, rank)
    return rows[-1]["step"] if rows else 0


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> subprocess.CompletedProcess[str]:
    """The CLI in-process (python start-up costs seconds on a loaded 2-core box); one call per
    test goes through ``python -m probe_cli`` to pin the real exit code."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(argv), code, out, err)


def targets(infos: list[dict]) -> str:
    return ",".join(i["url"] for i in infos)


def reference_lrs(make_sched, base_lr: float, steps: int) -> list[float]:
    """The LR each step uses in an unmodified run (logged before optimizer.step)."""
    import torch

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base_lr)
    sched = make_sched(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_lr_scale_changes_both_ranks_at_one_step_and_survives_schedulers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two optimizers, one under StepLR and one under CosineAnnealingLR (eta_min > 0): after
    `probe lr --scale 0.1` at step N every later LR is exactly 0.1 x the unmodified schedule, on
    both ranks from the same step. The same job also checks a queued action that raises, the
    action list, cancel, and the audit rows."""
    import torch

    log_dir = tmp_path / "log"
    args = ("--log-dir", str(log_dir), "--two-opts", "--opt", "sgd")
    with training_job(tmp_path, PROGRAM, args, nproc=2, timeout=150) as (proc, infos):
        t = targets(infos)
        # GIVEN an immediate eval that calls a collective (rank 1 died of SIGABRT and torchrun
        # tore the job down)
        coll = ("import torch\nprobe_c = torch.ones(1)\n"
                "torch.distributed.all_reduce(probe_c)\nprobe_c.item()")
        refused = cli(capsys, "-t", t, "eval", coll)
        # THEN it is refused on every rank, with the form to use instead
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "CollectiveInEvalError" in refused.stderr, refused.stderr
        assert "probe eval --next-step" in refused.stderr, refused.stderr
        # AND that form runs it on every rank at one step
        ran = cli(capsys, "-t", t, "eval", "--next-step", coll)
        assert ran.returncode == 0 and "2.0" in ran.stdout, ran.stdout + ran.stderr
        # GIVEN a queued action whose code raises
        boom = probe("-t", t, "eval", "--next-step", "raise ValueError('boom at %d' % probe_step)",
                     timeout=120)
        # THEN both ranks report it, with the traceback, and training goes on
        assert boom.returncode == 1, boom.stdout + boom.stderr
        assert "ValueError: boom at" in boom.stderr and "ranks 0,1" in boom.stderr, boom.stderr
        before = last_step(log_dir, 0)
        wait_until(lambda: last_step(log_dir, 0) > before + 2, 120, "training stopped after raise")

        # WHEN the LR is scaled mid-run
        res = cli(capsys, "-t", t, "--json", "lr", "--scale", "0.1")
        assert res.returncode == 0, res.stdout + res.stderr
        bodies = json.loads(res.stdout)
        steps = {b["data"]["step"] for b in bodies}
        assert len(steps) == 1 and [b["rank"] for b in bodies] == [0, 1], bodies
        n = steps.pop()
        for b in bodies:
            groups = [g for o in b["data"]["optimizers"] for g in o["groups"]]
            assert all(g["after"] == pytest.approx(g["before"] * 0.1) for g in groups), b
            assert {s["class"] for s in b["data"]["schedulers"]} == {"StepLR", "CosineAnnealingLR"}
        # ... and training runs past a StepLR boundary and several cosine steps
        wait_until(lambda: min(last_step(log_dir, r) for r in (0, 1)) >= n + 15, 120,
                   "ranks did not train 15 steps past the change")

        # THEN every LR after step N is 0.1 x the unmodified schedule, on both ranks alike
        total = n + 15
        ref_a = reference_lrs(lambda o: torch.optim.lr_scheduler.StepLR(o, 10, 0.5), 0.02, total)
        ref_b = reference_lrs(
            lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=30, eta_min=1e-3),
            0.01, total)
        per_rank = []
        for r in (0, 1):
            rows = [x for x in logged(log_dir, r) if x["step"] <= total]
            assert [x["step"] for x in rows] == list(range(1, total + 1))
            for x in rows:
                f = 0.1 if x["step"] > n else 1.0
                assert x["lr"][0] == pytest.approx(ref_a[x["step"] - 1] * f, rel=1e-9), (r, x, n)
                assert x["lr"][1] == pytest.approx(ref_b[x["step"] - 1] * f, rel=1e-9), (r, x, n)
            per_rank.append([x["lr"] for x in rows])
        assert per_rank[0] == per_rank[1]

        # WHEN an action is queued far ahead, listed, then cancelled
        for info in infos:
            r = httpx.post(info["url"] + "/v1/actions",
                           json={"code": "1", "step": 10**6, "id": "far-away"}, timeout=10)
            assert r.status_code == 200, r.text
        listed = cli(capsys, "-t", t, "actions")
        assert listed.returncode == 0 and "far-away" in listed.stdout, listed.stdout
        cancelled = cli(capsys, "-t", t, "--json", "actions", "cancel", "far-away")
        assert cancelled.returncode == 0, cancelled.stderr
        assert [b["action"]["state"] for b in json.loads(cancelled.stdout)] == ["cancelled"] * 2

        # THEN the audit table says who asked what, for which step, and how it went (earlier
        # action ids, if any, are --next-step attempts that lost a race with a step: cancelled)
        audit = cli(capsys, "-t", t, "--json", "query",
                    "SELECT outcome, at_step, requested_by FROM python.audit "
                    f"WHERE action_id = '{bodies[0]['id']}' ORDER BY timestamp")
        for b in json.loads(audit.stdout):
            assert [row[:2] for row in b["rows"]] == [["queued", n], ["ok", n]], b
            assert all(row[2] and "@" in row[2] for row in b["rows"])


def test_pause_checkpoint_resume_round_trip_reproduces_the_next_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pause -> checkpoint (runs at the held step) -> an eval dumps the in-memory state while
    held -> resume. The checkpoint equals the in-memory state, and a fresh 2-rank job resumed
    from it reproduces the next three losses of the uninterrupted run exactly."""
    import torch

    log_dir, ckpt, ref = tmp_path / "log", tmp_path / "ck" / "state.pt", tmp_path / "ref"
    ref.mkdir()
    args = ("--log-dir", str(log_dir), "--sched", "cosine")
    with training_job(tmp_path, PROGRAM, args, nproc=2, timeout=150) as (proc, infos):
        t = targets(infos)
        # WHEN every rank is paused
        paused = cli(capsys, "-t", t, "--json", "pause")
        assert paused.returncode == 0, paused.stdout + paused.stderr
        held = {b["data"]["paused_at"] for b in json.loads(paused.stdout)}
        assert len(held) == 1, paused.stdout
        p = held.pop()
        # THEN training is held inside step p (after optimizer.step, before its log line)
        wait_until(lambda: all(last_step(log_dir, r) == p - 1 for r in (0, 1)), 10,
                   "ranks not held at the paused step")
        # WHEN a checkpoint is taken (the next step no rank has passed is the held one)
        saved = cli(capsys, "-t", t, "--json", "checkpoint", str(ckpt))
        assert saved.returncode == 0, saved.stdout + saved.stderr
        assert {b["data"]["step"] for b in json.loads(saved.stdout)} == {p}
        # ... and a plain eval (agent thread, training held) dumps the live state
        dump = (f"torch.save({{'model': net.state_dict(), 'opt': optimizer.state_dict(), "
                f"'sched': scheduler.state_dict(), 'rng': torch.get_rng_state()}}, "
                f"'{ref}/rank%d.pt' % torch.distributed.get_rank())")
        dumped = cli(capsys, "-t", t, "eval", "import torch\n" + dump)
        assert dumped.returncode == 0, dumped.stderr
        assert all(last_step(log_dir, r) == p - 1 for r in (0, 1)), "training moved while paused"
        resumed = cli(capsys, "-t", t, "resume")
        assert resumed.returncode == 0, resumed.stderr
        wait_until(lambda: min(last_step(log_dir, r) for r in (0, 1)) >= p + 3, 120,
                   "training did not resume")

    # THEN the checkpoint holds exactly the in-memory state of step p
    from probe_agent.actions.checkpoint import load

    for r in (0, 1):
        state = load(str(ckpt), r)
        live = torch.load(ref / f"rank{r}.pt", weights_only=False)
        assert state["step"] == p
        assert state["model"].keys() == live["model"].keys()
        for k, v in live["model"].items():
            assert torch.equal(state["model"][k], v), k
        for pid, s in live["opt"]["state"].items():
            for k, v in s.items():
                assert torch.equal(torch.as_tensor(state["optimizer"]["state"][pid][k]),
                                   torch.as_tensor(v)), (pid, k)
        assert state["scheduler"] == live["sched"]
        assert torch.equal(state["rng"]["torch"], live["rng"])
    assert not list(ckpt.parent.glob("*.tmp-*")), "temporary files left behind"

    # WHEN a new job resumes from it for three steps
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
         "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", str(PROGRAMS / PROGRAM),
         "--log-dir", str(tmp_path / "resumed"), "--resume", str(ckpt), "--steps", "3",
         "--sched", "cosine", "--step-sleep", "0"],
        env=python_env(), capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # THEN its losses are exactly those of the uninterrupted run
    for r in (0, 1):
        again = [(x["step"], x["loss"]) for x in logged(tmp_path / "resumed", r)]
        first = [(x["step"], x["loss"]) for x in logged(log_dir, r) if p < x["step"] <= p + 3]
        assert again == first and len(again) == 3, (r, again, first)


def test_target_step_a_hung_rank_never_reaches_is_reported_without_a_new_hang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 1 stops after step 3 (outside any collective); rank 0 trains on. An action for the
    next step reaches rank 0 only: the CLI gives up after --wait, cancels everywhere, says which
    rank never got there, and rank 0 was never held in the action (nor after it)."""
    log_dir = tmp_path / "log"
    args = ("--log-dir", str(log_dir), "--no-ddp", "--hang-rank", "1", "--hang-after-step", "3",
            "--step-sleep", "0.2")
    with training_job(tmp_path, PROGRAM, args, nproc=2, timeout=150) as (proc, infos):
        wait_until(lambda: last_step(log_dir, 1) == 3 and last_step(log_dir, 0) > 4, 120,
                   "rank 1 did not stop at step 3 while rank 0 trained on")
        # WHEN an eval is queued for the next step with a short wait
        res = cli(capsys, "-t", targets(infos), "eval", "--next-step", "--wait", "3",
                    "torch.distributed.all_reduce(torch.ones(1))")
        # THEN the report names the rank that never reached the step, and nothing ran
        assert res.returncode == 1, res.stdout + res.stderr
        assert "never reached step" in res.stderr and "(at step 3)" in res.stderr, res.stderr
        assert "gave up waiting after 3 s" in res.stderr, res.stderr
        assert "skipped on every rank" in res.stderr, res.stderr
        # ... nothing is left queued or agreeing on any rank
        for info in infos:
            acts = httpx.get(info["url"] + "/v1/actions", timeout=10).json()["actions"]
            # (more than one when a --next-step race with rank 0's step was retried)
            assert acts and {a["state"] for a in acts} <= {"cancelled", "skipped"}, acts
        # ... and rank 0 is still training (no new hang)
        now = last_step(log_dir, 0)
        wait_until(lambda: last_step(log_dir, 0) > now + 3, 120, "rank 0 stopped training")
        assert last_step(log_dir, 1) == 3
        assert not math.isnan(logged(log_dir, 0)[-1]["loss"])


def test_lr_without_a_scheduler_reports_the_next_step(tmp_path: Path) -> None:
    # GIVEN a job whose optimizer no scheduler steps (and whose loop leaves the LR alone)
    log_dir = tmp_path / "log"
    with training_job(tmp_path, PROGRAM, ("--log-dir", str(log_dir), "--sched", "none"),
                      timeout=120) as (_, infos):
        # WHEN the LR is halved
        res = probe("-t", targets(infos), "lr", "--scale", "0.5", timeout=90)
        # THEN the command waits for the next step and says it ran with the new LR
        assert res.returncode == 0, res.stdout + res.stderr
        assert "no LR scheduler steps these optimizers" in res.stdout, res.stdout
        assert "held: step " in res.stdout and "ran with the new LR on rank 0" in res.stdout, (
            res.stdout)
