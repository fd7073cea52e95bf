"""A sharded checkpoint (FSDP2 on a 1-rank gloo group, CPU) never destroys (issue 20).

It runs in a child process: a process group in the test process would outlive the test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import python_env

pytest.importorskip("torch")

SCRIPT = r'''
import os, sys
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from probe_agent.actions.checkpoint import save
from probe_agent.actions.checkpoint_target import CheckpointError

d = sys.argv[1]
dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
fully_shard(m, mesh=init_device_mesh("cpu", (1,)))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
m(torch.randn(2, 4)).sum().backward()
opt.step()

def attempt(path, step, overwrite=False):
    try:
        r = save(path, step=step, rank=0, world_size=1, tag=f"t{step}", models=[("m", m)],
                 optimizers=[opt], schedulers=[], overwrite=overwrite)
        print("ok", r["mode"])
    except CheckpointError as e:
        print("refused", e)

ck = os.path.join(d, "ck")
attempt(ck, 1)
attempt(ck, 2)
attempt(ck, 3, overwrite=True)
with open(os.path.join(d, "afile"), "w") as f:
    f.write("precious")
attempt(os.path.join(d, "afile"), 4, overwrite=True)
dist.destroy_process_group()
'''


def test_sharded_checkpoint_replaces_only_its_own_directory(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env=python_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    # THEN a new directory is written; the same path again is refused without --overwrite
    assert lines[0] == "ok torch.distributed.checkpoint", done.stdout
    assert lines[1].startswith(f"refused {tmp_path / 'ck'} exists (a directory): pass "
                               "--overwrite"), done.stdout
    # ... replaced with it, leaving no temporary or old directory
    assert lines[2] == "ok torch.distributed.checkpoint", done.stdout
    # ... and a file is never replaced by a checkpoint directory
    assert lines[3] == (f"refused {tmp_path / 'afile'} is a file: a sharded checkpoint is a "
                        "directory and never replaces a file; give a new path"), done.stdout
    assert (tmp_path / "afile").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "ck", "store"]
    import torch.distributed.checkpoint as dcp

    step = {"step": 0}
    dcp.load(step, checkpoint_id=str(tmp_path / "ck"))
    assert step["step"] == 3
