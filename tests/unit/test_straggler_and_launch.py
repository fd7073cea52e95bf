"""Pure parts of `probe straggler` and `probe launch` (the last test runs `probe launch`)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from probe_cli.commands.launch import launch_env
from probe_cli.diagnose.straggler import diagnose_stragglers
from probe_cli.main import cli


def lockstep(n_ranks, slow, lag, steps=50, period=0.06):
    """Two collectives per step; ``slow`` enters the first of each step ``lag`` s late."""
    rows = {r: [] for r in range(n_ranks)}
    for s in range(steps):
        for k in range(2):
            seq = 2 * s + k + 1
            for r in range(n_ranks):
                late = lag if (r == slow and k == 0) else 0.0
                rows[r].append({"pg": "0", "seq": seq, "start_time": s * period + k * 0.001 + late,
                                "group_ranks": list(range(n_ranks)), "is_p2p": False})
    return rows


def test_the_rank_the_others_wait_for_is_named_with_its_lag():
    v = diagnose_stragglers(lockstep(4, slow=2, lag=0.05))
    assert v.problem and v.culprits == [2]
    assert v.headline.startswith("STRAGGLER: rank 2 is 50.0 ms slower than the median rank")
    assert v.details[0].startswith("rank 2: last to arrive at 50 of 100 collectives")


def test_no_straggler_is_named_while_a_collective_hangs():
    # GIVEN rank 2 was late at every step, then stopped: ranks 0,1,3 wait in the next all_reduce
    rows = lockstep(4, slow=2, lag=0.05)
    end = 50 * 0.06
    for r in (0, 1, 3):
        rows[r].append({"pg": "0", "seq": 101, "start_time": end, "state": "pending",
                        "op": "all_reduce", "group_ranks": [0, 1, 2, 3], "is_p2p": False})
    # WHEN it is asked 9 s into the wait (the job's rhythm calls 3 s stuck)
    v = diagnose_stragglers(rows, now_by_rank={r: end + 9.0 for r in range(4)})
    # THEN there is no straggler verdict, and it says why
    assert not v.problem and not v.culprits, v.headline
    assert "looks hung" in v.headline and "all_reduce #101" in v.headline, v.headline
    assert "probe hang" in v.headline
    # AND a second into it (a normal wait) the straggler is still named
    assert diagnose_stragglers(rows, now_by_rank={r: end + 0.1 for r in range(4)}).problem


def test_balanced_ranks_have_no_straggler():
    v = diagnose_stragglers(lockstep(4, slow=None, lag=0.0))
    assert not v.problem and v.headline.startswith("no straggler")


def coin_tosses(last_by_rank0, n, lag=0.0105, period=0.06):
    """2 ranks, ``n`` collectives: rank 0 arrives ``lag`` s late at the first
    ``last_by_rank0``, rank 1 at the rest (who is last is shuffled evenly over the window)."""
    rows = {0: [], 1: []}
    order = [i * n // last_by_rank0 for i in range(last_by_rank0)]
    for seq in range(1, n + 1):
        late = 0 if (seq - 1) in order else 1
        for r in (0, 1):
            rows[r].append({"pg": "0", "seq": seq, "start_time": seq * period +
                            (lag if r == late else 0.0), "group_ranks": [0, 1], "is_p2p": False})
    return rows


def test_a_rank_last_about_as_often_as_chance_is_not_named():
    # GIVEN the measured false alarm: rank 0 last at 80 of 142 collectives, 10.5 ms late
    v = diagnose_stragglers(coin_tosses(80, 142), min_share=0.1)
    # THEN no straggler: p is far above the threshold, and the JSON says so
    assert not v.problem and "no rank is last more often than chance" in v.headline, v.headline
    assert v.to_json()["p_value"] > 0.01


def test_a_rank_last_far_more_often_than_chance_is_named():
    v = diagnose_stragglers(coin_tosses(130, 142, lag=0.03), min_share=0.1)
    assert v.problem and v.culprits == [0]
    assert v.to_json()["p_value"] < 1e-3


def test_collectives_missing_on_a_member_are_not_compared():
    rows = lockstep(2, slow=1, lag=0.05)
    rows[1] = []  # rank 1 answered but its recorder saw nothing
    assert not diagnose_stragglers(rows).problem


def test_launch_env_sets_probe_and_passes_the_token_file_not_the_token(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    env = launch_env({"PATH": "/bin", "PROBE_TOKEN": "old"}, port=9800, host="0.0.0.0",
                     token_file=str(token), trace="every:5")
    assert env == {"PATH": "/bin", "PROBE": "1", "PROBE_PORT": "9800", "PROBE_HOST": "0.0.0.0",
                   "PROBE_TOKEN_FILE": str(token), "PROBE_TRACE": "every:5"}


def test_launch_rejects_a_bad_trace_mode_and_a_missing_command():
    r = CliRunner().invoke(cli, ["launch", "--trace", "sometimes", "--", "python"])
    assert r.exit_code == 2 and "on, off or every:N" in r.output
    r = CliRunner().invoke(cli, ["launch", "--", "no-such-command-probe-test"])
    assert r.exit_code == 2 and "command not found" in r.output


def test_launch_off_loopback_makes_a_job_token_file_and_passes_its_path(tmp_path):
    """issue 19: agents off loopback serve TCP only with a token, so launch makes one."""
    env = {**os.environ, "PROBE_RUN_DIR": str(tmp_path / "run")}
    env.pop("PROBE_TOKEN", None)
    env.pop("PROBE_TOKEN_FILE", None)
    r = subprocess.run([sys.executable, "-m", "probe_cli", "launch", "--host", "0.0.0.0", "--",
                        "sh", "-c", 'echo "$PROBE_TOKEN_FILE"; echo "${PROBE_TOKEN:-none}"'],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    path, token_env = r.stdout.split()
    assert path.startswith(str(tmp_path / "run")) and token_env == "none"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(Path(path).read_text().strip()) >= 32
    assert f"made the job token in {path}" in r.stderr
    # a shared file given to a second node is used as it is, never replaced
    r2 = subprocess.run([sys.executable, "-m", "probe_cli", "launch", "--token-file", path,
                         "--", "true"], env=env, capture_output=True, text=True, timeout=60)
    assert r2.returncode == 0 and f"job token in {path}" in r2.stderr
    # and one that others can read is refused with the fix
    os.chmod(path, 0o644)
    r3 = subprocess.run([sys.executable, "-m", "probe_cli", "launch", "--token-file", path,
                         "--", "true"], env=env, capture_output=True, text=True, timeout=60)
    assert r3.returncode == 2 and f"chmod 600 {path}" in r3.stderr


def bursts(late0_steps, steps, per_step=6, lag=0.01, period=0.06, late0=None, spacing=0.002):
    """2 ranks, ``per_step`` collectives a step (DDP buckets): the rank late at a step is late
    at all of its collectives; rank 0 at ``late0_steps`` of the steps, spread evenly (or at the
    steps in ``late0``)."""
    rows = {0: [], 1: []}
    if late0 is None:
        late0 = {i * steps // late0_steps for i in range(late0_steps)}
    for s in range(steps):
        late = 0 if s in late0 else 1
        for k in range(per_step):
            seq = s * per_step + k + 1
            for r in (0, 1):
                rows[r].append({"pg": "0", "seq": seq, "is_p2p": False, "group_ranks": [0, 1],
                                "start_time": s * period + k * spacing + (lag if r == late else 0)})
    return rows


def test_collectives_of_one_step_count_as_one_sample():
    # GIVEN a busy node: rank 0 late at 23 of 35 steps (p = 0.09 over steps), each step's 6
    # collectives late together (138 of 210: p = 1e-5 if each counted on its own)
    v = diagnose_stragglers(bursts(23, 35), min_share=0.1)
    # THEN no straggler: the test counts independent samples, and says how many
    assert not v.problem, v.headline
    assert "no rank is last more often than chance" in v.headline, v.headline
    assert "counted once a step" in v.details[-1], v.details
    # AND a rank late at every step is still named
    v = diagnose_stragglers(bursts(35, 35), min_share=0.1)
    assert v.problem and v.culprits == [0], v.headline


def test_a_straggler_that_starts_mid_window_is_named():
    # GIVEN ranks late by turns for 10 steps, then rank 0 late at every one of 25 steps
    late0 = {s for s in range(10) if s % 2} | set(range(10, 35))
    v = diagnose_stragglers(bursts(0, 35, late0=late0), min_share=0.1)
    # THEN rank 0 is named: steps are independent samples whatever the order
    assert v.problem and v.culprits == [0], (v.headline, v.details)


def test_the_step_time_bounds_the_samples_when_gaps_do_not_show_steps():
    # GIVEN 2 micro-batches a step whose all-reduces are 20 ms apart in a 60 ms step (gaps of
    # 20 and 40 ms: no clear step boundary), rank 0 late at 46 of 70 steps (p = 0.02 as steps;
    # as 140 collectives p = 3e-4, a false alarm)
    rows = bursts(46, 70, per_step=2, spacing=0.02)
    assert diagnose_stragglers(rows, min_share=0.1).problem
    # WHEN the ranks' step time is known, THEN the window counts as 70 samples: not named
    v = diagnose_stragglers(rows, min_share=0.1, step_s=0.06)
    assert not v.problem and "counted once a step" in v.details[-1], (v.headline, v.details)


@pytest.mark.parametrize("argv,role", [
    (["/v/bin/python", "-m", "torch.distributed.run", "--nproc-per-node=2", "t.py"], "launcher"),
    (["/v/bin/python", "/v/bin/torchrun", "--nproc-per-node=2", "t.py"], "launcher"),
    (["/v/bin/python", "/v/bin/accelerate", "launch", "t.py"], "launcher"),
    (["/v/bin/python", "-m", "probe_agent.collectors.tracer.native_build", "x", "/d", "1"],
     "probe helper"),
    (["/v/bin/python", "-m", "probe_cli", "ui"], "probe helper"),
    (["/v/bin/python", "train.py", "--torchrun"], None),
    (["/v/bin/python", "-u", "train.py"], None),
], ids=["torchrun-m", "torchrun", "accelerate", "native-build", "cli", "script", "script-u"])
def test_ps_does_not_offer_launchers_and_probe_helpers_for_injection(argv, role):
    from probe_cli.commands.ps import _role

    assert _role(argv) == role


def test_lateness_the_cpu_wait_of_every_rank_explains_names_no_straggler():
    # GIVEN rank 2 last at every step by 5 ms of 60 (8% excess), and every rank's training
    # thread waiting for a CPU about a third of its step time (an oversubscribed host)
    rows = lockstep(4, slow=2, lag=0.005)
    assert diagnose_stragglers(rows).problem  # without the CPU waits: named
    v = diagnose_stragglers(rows, cpu_wait={0: 0.33, 1: 0.36, 2: 0.38, 3: 0.34})
    # THEN no rank is blamed: the lateness is the scheduler's, and the verdict says so
    assert not v.problem and v.contention and v.culprits == []
    assert "wait for a CPU 33%-38%" in v.headline and "oversubscribed" in v.headline
    assert v.to_json()["cpu_contention"] is True


def test_a_rank_whose_own_cores_are_busy_is_named_with_that_cause():
    rows = lockstep(4, slow=2, lag=0.005)
    v = diagnose_stragglers(rows, cpu_wait={0: 0.01, 1: 0.02, 2: 0.30, 3: 0.01})
    assert v.problem and v.culprits == [2] and not v.contention
    assert "waited for a CPU 30% of its step time" in v.headline


def test_lateness_beyond_any_cpu_wait_is_still_a_straggler():
    # a 50 ms sleep a step (the fault suite's slow rank) on a busy host: the waits explain
    # at most 20% of its step time, its excess is far more
    rows = lockstep(4, slow=2, lag=0.05)
    v = diagnose_stragglers(rows, cpu_wait={0: 0.2, 1: 0.2, 2: 0.2, 3: 0.2})
    assert v.problem and v.culprits == [2]
    assert any("more than that explains" in d for d in v.details)
