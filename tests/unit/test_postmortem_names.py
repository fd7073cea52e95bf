"""A copy is named per run (probe_protocol/postmortem.py ``job_name``): torchrun's default run
id "none" on a fixed port, a restart, a requeue or an srun step never share an earlier run's
directory; a name read from the job's store is data."""

from __future__ import annotations

from probe_protocol import postmortem as layout

NONE = {"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_unnamed_runs_on_one_port_differ_by_launch():
    a = layout.job_name(NONE, 11, "20261127T090000-4242")
    b = layout.job_name(NONE, 11, "20261127T091500-5151")
    assert a != b and a.startswith("10.0.0.1-29500-") and b.startswith("10.0.0.1-29500-")
    assert layout.run_id(NONE) is None


def test_named_runs_keep_their_name_per_attempt():
    env = {**NONE, "TORCHELASTIC_RUN_ID": "exp7"}
    assert layout.job_name(env, 1, "x") == "exp7"
    assert layout.job_name({**env, "TORCHELASTIC_RESTART_COUNT": "2"}, 1, "x") == "exp7-a2"
    slurm = {"SLURM_JOB_ID": "991"}
    assert layout.job_name(slurm, 1, "x") == "991"
    assert layout.job_name({**slurm, "SLURM_RESTART_COUNT": "1"}, 1, "x") == "991-r1"
    assert layout.job_name({**slurm, "SLURM_STEP_ID": "3"}, 1, "x") == "991.3"
    assert layout.job_name({"PROBE_JOB": "a/../b"}, 1, "x") == "a_.._b"


def test_a_lone_process_is_named_after_itself_and_its_start():
    assert layout.job_name({}, 77, "20261127T090000-77") == "pid-77-20261127T090000-77"


def test_names_from_the_store_are_checked():
    for bad in ("", ".", "..", "../home", "a/b", "x" * 81, "a\x1b[2J"):
        assert not layout.is_job_name(bad), bad
    assert layout.is_job_name("10.0.0.1-29500-20261127T090000-4242")
