"""Which processes start an agent at start-up, which defer to init_process_group, which never
(issue 17). ``decide`` is pure: command line and environment in, START / DEFER / NO out."""

from __future__ import annotations

import pytest

from probe_agent._autostart import DEFER, NO, START, decide

PY = "/venv/bin/python"
SPAWN_CHILD = [
    PY,
    "-c",
    "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
    "--multiprocessing-fork",
]
# What an agent leaves in its environment for its children (agent.start / adopt_group).
UNDER_RANK0 = {"PROBE_AGENT_PID": "100", "PROBE_AGENT_RANK": "0:0"}

LAUNCHERS = [
    pytest.param(
        [PY, "-m", "torch.distributed.run", "--nproc-per-node=2", "t.py"], id="torchrun-module"
    ),
    pytest.param([PY, "/venv/bin/torchrun", "t.py"], id="torchrun-script"),
    pytest.param(
        [PY, "/venv/bin/accelerate", "launch", "--num_processes=2", "t.py"], id="accelerate-launch"
    ),
    pytest.param([PY, "/venv/bin/accelerate-launch", "t.py"], id="accelerate-launch-script"),
    pytest.param([PY, "-m", "accelerate.commands.launch", "t.py"], id="accelerate-launch-module"),
    pytest.param([PY, "/venv/bin/deepspeed", "--num_gpus=2", "t.py"], id="deepspeed"),
    pytest.param(
        [PY, "-u", "-m", "deepspeed.launcher.launch", "--world_info=x"], id="deepspeed-launch"
    ),
    pytest.param(
        [PY, "-m", "deepspeed.launcher.launch", "--world_info=x"], id="deepspeed-launch-m"
    ),
    pytest.param([PY, "-m", "torch._inductor.compile_worker", "--pool"], id="compile-worker"),
    pytest.param(
        [
            PY,
            "/venv/lib/python3.11/site-packages/torch/_inductor/compile_worker/__main__.py",
            "--kind=fork",
            "--workers=2",
        ],
        id="compile-worker-by-path",
    ),
]


@pytest.mark.parametrize("argv", LAUNCHERS)
def test_launchers_never_carry_an_agent(argv):
    assert decide(argv, {}, 1) == NO
    # not even below an agent with a rank of their own in the environment
    assert decide(argv, {**UNDER_RANK0, "RANK": "1", "LOCAL_RANK": "1"}, 1) == NO


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        pytest.param([PY, "train.py"], {}, START, id="python-train"),
        pytest.param(
            [PY, "train.py"], {"RANK": "3", "LOCAL_RANK": "1"}, START, id="torchrun-worker"
        ),
        pytest.param(
            [PY, "/home/me/deepspeed_runs/train.py"], {}, START, id="path-mentions-deepspeed"
        ),
        pytest.param(
            [PY, "/venv/bin/accelerate", "config"], {}, START, id="accelerate-config-is-no-launcher"
        ),
        # the process itself exec'd again: its own PROBE_AGENT_PID
        pytest.param(
            [PY, "train.py"],
            {"PROBE_AGENT_PID": "7", "PROBE_AGENT_RANK": "0:0"},
            START,
            id="own-pid",
        ),
    ],
)
def test_ranks_with_no_agent_above_start_at_once(argv, env, expected):
    assert decide(argv, env, 7) == expected


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # Lightning's _SubprocessScriptLauncher: LOCAL_RANK=N (no RANK) for rank N's process
        pytest.param({"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, START, id="lightning-rank1"),
        # torchrun started from a process that has an agent: its workers have RANK of their own
        pytest.param({"RANK": "1", "LOCAL_RANK": "1"}, START, id="torchrun-under-agent"),
        pytest.param({"RANK": "2", "LOCAL_RANK": "0"}, START, id="other-node-rank-same-local"),
        pytest.param({"SLURM_PROCID": "1", "SLURM_LOCALID": "1"}, START, id="srun-names"),
        # worker 0 of such a torchrun matches the agent above: deferred to init_process_group
        pytest.param({"RANK": "0", "LOCAL_RANK": "0"}, DEFER, id="torchrun-rank0-under-agent"),
        # Lightning's rank 0 sets LOCAL_RANK=0 / WORLD_SIZE=2 for itself after its agent started:
        # its subprocesses inherit them, and are not new ranks
        pytest.param(
            {"LOCAL_RANK": "0", "WORLD_SIZE": "2"}, DEFER, id="lightning-rank0-subprocess"
        ),
        pytest.param({}, DEFER, id="plain-subprocess"),
        pytest.param({"LOCAL_RANK": "x"}, DEFER, id="unparsable-rank"),
    ],
)
def test_children_of_an_agent_start_only_with_a_rank_of_their_own(env, expected):
    assert decide([PY, "worker.py"], {**UNDER_RANK0, **env}, 200) == expected


def test_children_of_lightning_rank1_are_not_new_ranks():
    # GIVEN rank 1's agent (PROBE_AGENT_RANK 1:1) and the LOCAL_RANK=1 its children inherit
    env = {"PROBE_AGENT_PID": "300", "PROBE_AGENT_RANK": "1:1", "LOCAL_RANK": "1"}
    # THEN a subprocess and a spawn DataLoader worker both defer (and never call init)
    assert decide([PY, "tool.py"], env, 301) == DEFER
    assert decide(SPAWN_CHILD, env, 302) == DEFER


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="no-agent-above"),
        pytest.param(UNDER_RANK0, id="under-agent"),
        # the copied environment of a torchrun rank 1: RANK=1 is its parent's, not its own
        pytest.param(
            {"PROBE_AGENT_PID": "100", "PROBE_AGENT_RANK": "1:1", "RANK": "1", "LOCAL_RANK": "1"},
            id="under-torchrun-rank",
        ),
        pytest.param({"PROBE_AGENT_RANK": "0:0", "RANK": "5"}, id="env-differs-but-copied"),
    ],
)
def test_multiprocessing_children_defer_to_init_process_group(env):
    """mp.spawn ranks and spawn DataLoader workers look alike at start-up: both defer, and
    only the one that calls init_process_group becomes a rank."""
    assert decide(SPAWN_CHILD, env, 9) == DEFER
    tracker = [PY, "-c", "from multiprocessing.resource_tracker import main;main(5)"]
    assert decide(tracker, env, 9) == DEFER
    forkserver = [PY, "-c", "from multiprocessing.forkserver import main; main(8, 9, ['__main__'])"]
    assert decide(forkserver, env, 9) == DEFER


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param([PY, "-um", "torch.distributed.run", "t.py"], NO, id="flags-run-together"),
        pytest.param(
            [PY, "-X", "dev", "-W", "error", "-m", "torch.distributed.run"],
            NO,
            id="options-with-values",
        ),
        pytest.param(
            [PY, "-Xpycache_prefix=/tmp/abc", "train.py"], START, id="x-value-ending-in-c"
        ),
        pytest.param(
            [PY, "-B", "-c", "from multiprocessing.spawn import spawn_main"],
            DEFER,
            id="flag-before-c",
        ),
        pytest.param([PY], START, id="bare-interpreter"),
    ],
)
def test_interpreter_options_are_skipped(argv, expected):
    assert decide(argv, {}, 1) == expected


def test_start_up_copies_of_the_rank_variables_match_settings():
    from probe_agent import _autostart, settings

    assert _autostart.RANK_VARS == settings.RANK_VARS
    assert _autostart.LOCAL_RANK_VARS == settings.LOCAL_RANK_VARS
