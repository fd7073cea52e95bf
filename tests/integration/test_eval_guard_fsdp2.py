"""An immediate eval never reshards FSDP2 parameters under the training thread (eval_guard.py).

A real FSDP2 model on a 1-rank gloo group (CPU), in a child process (a process group in the test
process would outlive the test), and the real Evaluator: mid-step (the groups unsharded, as the
training thread holds them in forward and backward) ``model.state_dict()`` from an eval is refused
with what to run instead and the groups stay unsharded; at a step boundary (sharded) it works.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import run_script_result

pytest.importorskip("torch")

SCRIPT = r'''
import json, sys
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from probe_agent.evaluator import Evaluator

d = sys.argv[1]
dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
fully_shard(model[0], mesh=init_device_mesh("cpu", (1,)))
fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
ev = Evaluator(timeout_s=30, output_cap=10_000)
out = {}
model.unshard()  # what the training thread holds mid-step
group = model._get_fsdp_state()._fsdp_param_group
mid = ev.run("sd = model.state_dict()\nlen(sd)", {"model": model})
out["mid"] = [mid.ok, mid.error]
out["mid_still_unsharded"] = group.is_unsharded
out["own_thread"] = len(model.state_dict())  # the job's own code is never refused
model.unshard()
model.reshard()  # the step boundary: sharded again
at = ev.run("len(model.state_dict())", {"model": model})
out["boundary"] = [at.ok, at.result, at.error]
print("RESULT " + json.dumps(out))
dist.destroy_process_group()
'''


def test_a_mid_step_state_dict_from_an_eval_is_refused_and_works_at_a_boundary(tmp_path: Path):
    out = run_script_result(SCRIPT, str(tmp_path), timeout=120)
    ok, error = out["mid"]
    assert not ok and error.startswith("MidStepReshard: probe refused: on FSDP2"), out
    assert "probe eval --next-step" in error
    assert out["mid_still_unsharded"] is True  # refused before anything was swapped
    assert out["own_thread"] == 4
    assert out["boundary"] == [True, "4", None], out
