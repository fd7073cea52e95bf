"""The checks every framework e2e test runs on its live job (issue 17), against the program's
per-step log (tests/programs/fw_common.py: ``{"global_step", "lr", "param_sum"}`` per line).

- ``seed_playbook``: the seed playbook's commands, queries and evals verbatim.
- ``lr_scale_holds``: `probe lr --scale 0.5`, then the LR the framework uses is still half of
  what its schedule gives, 20 steps later (the ratio to the schedule's own formula halves at the
  action's step and stays halved).
- ``checkpoint_loads_back``: `probe checkpoint`, then the program's ``--verify-checkpoint``
  loads it into a fresh framework setup; the parameters equal the job's at that step.
- ``steps_agree``: held at a step boundary, `probe steps` ends at the framework's own count.
- ``no_hang``: `probe hang` on the healthy job says so, exit 0.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.training import probe
from tests.support import PROGRAMS, python_env, wait_until

THREADS_EVAL = ("import threading\nfor t in threading.enumerate():\n"
                "    print(f'{t.name}: alive={t.is_alive()}')")
LR_EVAL = "for pg in optimizer.param_groups:\n    pg['lr'] *= 0.1"
STACK_QUERY = "SELECT func, file, lineno, depth FROM python.backtrace ORDER BY depth LIMIT 10"
FRAMEWORK_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PROBE_TRACE": "off",
                 "TOKENIZERS_PARALLELISM": "false"}


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (
        f"{result.args}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result


def read_log(log_dir: Path, rank: int = 0) -> dict[int, dict]:
    """``global_step -> line`` of one rank's log (the last line may be half written)."""
    out = {}
    path = log_dir / f"rank{rank}.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[rec["global_step"]] = rec
    return out


def wait_for_step(log_dir: Path, step: int, ranks: int = 1, timeout: float = 60) -> None:
    wait_until(lambda: all(max(read_log(log_dir, r), default=0) >= step for r in range(ranks)),
               timeout, f"the job did not reach global_step {step}")


def seed_playbook(endpoint: str, program: str, save_to: Path, save_rank: str | None = None
                  ) -> None:
    """The seed playbook verbatim. ``save_rank``: which rank runs the ``torch.save`` eval (two
    ranks writing one file at once would race)."""
    bt = ok(probe("-t", endpoint, "backtrace"))
    assert program in bt.stdout, bt.stdout
    q = ok(probe("-t", endpoint, "query", STACK_QUERY))
    assert "func" in q.stdout and "depth" in q.stdout
    ev = ok(probe("-t", endpoint, "eval", THREADS_EVAL))
    assert "MainThread: alive=True" in ev.stdout, ev.stdout
    nw = ok(probe("-t", endpoint, "--json", "eval", "train_loader.num_workers"))
    assert {r["result"] for r in json.loads(nw.stdout)} == {"0"}, nw.stdout
    before = ok(probe("-t", endpoint, "--json", "eval", "optimizer.param_groups[0]['lr']"))
    lrs = [float(r["result"]) for r in json.loads(before.stdout)]
    assert all(x > 0 for x in lrs), before.stdout
    ok(probe("-t", endpoint, "eval", LR_EVAL))
    where = ("--rank", save_rank) if save_rank is not None else ()
    # At a step boundary: mid-step, FSDP2's state_dict() would reshard parameters under the
    # training thread, and the agent refuses it from an immediate eval (eval_guard.py).
    save = ok(probe("-t", endpoint, *where, "eval", "--next-step",
                    f"torch.save({{'model': model.state_dict(), 'optimizer': "
                    f"optimizer.state_dict()}}, {str(save_to)!r})"))
    assert save_to.exists(), save.stdout + save.stderr
    import torch

    state = torch.load(save_to, weights_only=False)
    assert set(state) == {"model", "optimizer"} and state["model"] and state["optimizer"]["state"]


def lr_scale_holds(endpoint: str, log_dir: Path, schedule: Callable[[int], float],
                   ranks: int = 1, later: int = 20) -> int:
    """`probe lr --scale 0.5` at step N; returns N. ``schedule(s)``: the schedule's factor after
    ``s`` scheduler steps (the LR logged at global_step s is base x schedule(s) x whatever the
    operator changed)."""
    out = ok(probe("-t", endpoint, "--json", "lr", "--scale", "0.5"))
    results = json.loads(out.stdout)
    steps = {r["step"] for r in results}
    assert len(steps) == 1 and len(results) == ranks, out.stdout
    n = steps.pop()
    for r in results:  # every scheduler's next step was checked to keep the change
        assert r["data"]["schedulers"], r["data"]
        assert {s["holds"] for s in r["data"]["schedulers"]} == {"holds"}, r["data"]
    wait_for_step(log_dir, n + later, ranks)
    for rank in range(ranks):
        log = read_log(log_dir, rank)
        ratio = {s: log[s]["lr"] / schedule(s) for s in range(n - 1, n + later + 1)}
        halved = {s: ratio[s] / ratio[n - 1] for s in range(n, n + later + 1)}
        assert all(math.isclose(h, 0.5, rel_tol=1e-6) for h in halved.values()), (
            f"rank {rank}: LR / schedule relative to step {n - 1}: {halved}")
    return n


def checkpoint_loads_back(endpoint: str, path: Path, log_dir: Path, verify: list[str],
                          framework: str, ranks: int = 1) -> dict:
    """`probe checkpoint PATH`, then ``verify`` (a command that prints ``PROBE-VERIFY {json}``
    per rank after loading PATH into a fresh setup); returns rank 0's verify record."""
    out = ok(probe("-t", endpoint, "--json", "checkpoint", str(path)))
    results = json.loads(out.stdout)
    n = results[0]["step"]
    names = results[0]["data"]["names"]
    assert names["model"] and names["optimizer"] and names["scheduler"], names
    wait_for_step(log_dir, n, ranks)
    run = subprocess.run(verify, capture_output=True, text=True, timeout=120,
                         env=python_env(**FRAMEWORK_ENV))
    assert run.returncode == 0, run.stdout + run.stderr
    records = [json.loads(line.split(" ", 1)[1]) for line in run.stdout.splitlines()
               if line.startswith("PROBE-VERIFY ")]
    assert len(records) == ranks, run.stdout + run.stderr
    for rec in sorted(records, key=lambda r: r.get("rank", 0)):
        rank = rec.get("rank", 0)
        logged = read_log(log_dir, rank)[n]
        assert rec["step"] == n
        assert rec["framework"] == framework
        # the parameters are the job's own at step N, not the fresh initialisation
        assert rec["param_sum"] == logged["param_sum"], (rec, logged)
        assert rec["param_sum"] != rec["fresh_param_sum"]
        # the scheduler as it was right after optimizer step N, before its own step N
        assert rec["scheduler_last_epoch"] == n - 1, rec
        assert rec["lr"] == rec["scheduler_lr"] > 0
        if "optimizer_steps" in rec:
            assert rec["optimizer_steps"] == [n], rec
    return records[0]


def steps_agree(endpoint: str, log_dir: Path, ranks: int = 1) -> None:
    """Held after optimizer step N (before the framework counts it), `probe steps` ends at the
    framework's last global_step on every rank."""
    held = ok(probe("-t", endpoint, "--json", "pause"))
    try:
        n = json.loads(held.stdout)[0]["step"]
        wait_for_step(log_dir, n - 1, ranks)  # written before step N began

        def last_steps() -> dict[int, int]:
            out = ok(probe("-t", endpoint, "--json", "steps"))
            trends = {r["rank"]: r["trend"] for r in json.loads(out.stdout)}
            # no row yet: the writer has not flushed this rank's first steps
            return {rank: t["rows"][0][t["columns"].index("last_step")] if t["rows"] else -1
                    for rank, t in trends.items()}

        # the agent's writer flushes the steps table every few seconds; held, nothing moves
        wait_until(lambda: all(v >= n - 1 for v in last_steps().values()), 20,
                   "probe steps never reached the held step")
        last = last_steps()
        assert len(last) == ranks
        for rank, step in last.items():
            assert step == max(read_log(log_dir, rank)) == n - 1, (rank, step, n)
    finally:
        ok(probe("-t", endpoint, "resume"))


def no_hang(endpoint: str) -> None:
    out = ok(probe("-t", endpoint, "hang"))
    assert out.stdout.startswith("no hang"), out.stdout


def verify_command(program: str, *args: str, nproc: int = 0) -> list[str]:
    cmd = [sys.executable]
    if nproc:
        cmd += ["-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0"]
    return [*cmd, str(PROGRAMS / program), *args]


def deepspeed_checkpoint_loads(program: str, path: Path, log_dir: Path, n: int, framework: str,
                               env: dict[str, str]) -> dict:
    """A DeepSpeed `probe checkpoint PATH` taken at step N of a 2-rank job: ``program
    --verify-checkpoint PATH`` (no DeepSpeed engine) loads the consolidated weights strictly
    into a fresh model, they are the job's at step N (rank 0's log) and no weight is an empty
    ZeRO-3 partition; ``PATH.deepspeed`` holds one optimizer partition per rank. Returns the
    verify record."""
    shards = sorted(p.name for p in (path.parent / f"{path.name}.deepspeed" / f"global_step{n}")
                    .iterdir() if p.name.endswith("optim_states.pt"))
    assert shards == ["zero_pp_rank_0_mp_rank_00_optim_states.pt",
                      "zero_pp_rank_1_mp_rank_00_optim_states.pt"], shards
    wait_for_step(log_dir, n, ranks=2)
    run = subprocess.run(verify_command(program, "--verify-checkpoint", str(path)),
                         capture_output=True, text=True, timeout=120, env=python_env(**env))
    assert run.returncode == 0, run.stdout + run.stderr
    rec = json.loads(next(line for line in run.stdout.splitlines()
                          if line.startswith("PROBE-VERIFY ")).split(" ", 1)[1])
    logged = read_log(log_dir, 0)[n]
    assert rec["step"] == n and rec["framework"] == framework, rec
    assert [0] not in rec["shapes"], rec  # ZeRO-3's empty partitions were gathered
    assert rec["param_sum"] == logged["param_sum"], (rec, logged)  # the job's after step N
    assert rec["param_sum"] != rec["fresh_param_sum"]
    return rec


def tokens_from_inputs(endpoint: str, per_step: int, micro_batches: int) -> None:
    """With tracing on for a few steps, `probe throughput` counts ``per_step`` tokens per
    optimizer step (B x T of input_ids summed over the micro-batches) and the FLOP-measured
    step; tracing goes back off after."""
    ok(probe("-t", endpoint, "trace", "on"))
    try:
        def row() -> dict | None:
            out = ok(probe("-t", endpoint, "--json", "throughput", "--last", "3"))
            t = json.loads(out.stdout)[0]["throughput"]
            return t if t and t.get("tokens_source") == "inputs" else None

        t = wait_until(row, 60, "no traced step counted tokens")
        assert t["tokens"] == per_step and t["micro_batches"] == micro_batches, t
        assert t["flops"] and t["flops_6n"] == pytest.approx(
            t["flops_6n_per_token"] * per_step), t
    finally:
        ok(probe("-t", endpoint, "trace", "off"))
