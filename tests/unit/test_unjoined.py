"""Ranks that never joined (transport/unjoined.py, diagnose/hang.py): an agent up on this
machine but missing from the job's rank list is found through the run dir and named with where
it is, not called silent."""

from __future__ import annotations

import json
import os
from pathlib import Path

from probe_cli.diagnose.hang import RankState, diagnose
from probe_cli.transport.unjoined import find_unjoined
from probe_protocol.bodies import InfoBody

ARGV = ("train.py", "--epochs", "3")
INIT = {"func": "init_process_group", "file": "/py/torch/distributed/distributed_c10d.py",
        "lineno": 1500}
MAIN = {"func": "main", "file": "/job/train.py", "lineno": 40}
LOAD = {"func": "load_shards", "file": "/job/train.py", "lineno": 12}


def agent_files(run_dir: Path, pid: int, rank: int, argv=ARGV, world=2) -> None:
    run_dir.mkdir(mode=0o700, exist_ok=True)
    (run_dir / f"{pid}.sock").write_text("")
    (run_dir / f"{pid}.json").write_text(json.dumps(
        {"rank": rank, "world_size": world, "pid": pid, "argv": list(argv)}))


def test_an_agent_of_the_same_job_missing_from_the_rank_list_is_found(tmp_path: Path):
    run = tmp_path / "run"
    agent_files(run, os.getpid(), 1)  # a live pid: this test's own
    me = InfoBody(rank=0, world_size=2, pid=1, argv=ARGV)
    found = find_unjoined(str(run), me, [1])
    assert list(found) == [1] and found[1].uds == str(run / f"{os.getpid()}.sock")
    # another job (other argv or world size) or a rank not missing is not taken for it
    assert find_unjoined(str(run), InfoBody(rank=0, world_size=2, pid=1, argv=("x.py",)),
                         [1]) == {}
    assert find_unjoined(str(run), InfoBody(rank=0, world_size=4, pid=1, argv=ARGV), [1]) == {}
    assert find_unjoined(str(run), me, [2]) == {}


def test_the_verdict_names_the_rank_that_never_reached_init_process_group():
    states = [RankState(0, frames=(INIT, MAIN), now=100.0),
              RankState(1, frames=(LOAD, MAIN), now=100.0, unjoined_pid=4242)]
    v = diagnose(states)
    assert v.problem and v.culprits == [1]
    assert v.headline == ("HANG: rank 1 never reached init_process_group; it is in "
                          "load_shards (train.py:12). 1 rank waits for it in init_process_group")
    assert "rank 0 waits in init_process_group for the rest of the job" in v.details
