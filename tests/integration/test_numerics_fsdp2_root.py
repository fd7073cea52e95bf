"""The numerics recorder's root model on FSDP2 is the model, even when the heap walk that finds
it (no tracer: PROBE_TRACE=off, as the framework tests run) lands inside a forward.

FSDP2 swaps a module's registered parameters between the optimizer's sharded DTensors and
unsharded tensors while the module runs. The walk runs on the writer thread, beside the
training thread: one that judged the modules mid-forward took a block, or the ModuleList of
blocks, for the model (at load 9 one rank of two re-ran a block for the NaN hunt while the other
re-ran the model: their all-gathers no longer matched, and the verdict named 'mlp.fc1' on the
wrong rank). Here the writer tick's walk is made to run inside the second block's forward, on a
real FSDP2 model (1-rank gloo group, in a child process: a process group in the test process
would outlive the test), and the root the training thread then keeps must be the model.
"""

from __future__ import annotations

from pathlib import Path

from tests.support import run_script_result

SCRIPT = r'''
import json, os, sys, time
import torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

d = sys.argv[1]
os.environ.update(PROBE_PORT="0", PROBE_TRACE="off", PROBE_WATCHDOG="0", PROBE_RUN_DIR=d)
dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
import probe_agent

agent = probe_agent.start()
rec = agent.collectors.numerics
rec.inputs._find_at = time.monotonic() + 1e6  # the writer's walk waits for the one below


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.mlp = nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8))

    def forward(self, x):
        return x + self.mlp(x + self.attn(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.layers = nn.Linear(8, 8), nn.ModuleList([Block(), Block()])

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return x


torch.manual_seed(0)
model = Net()
mesh = init_device_mesh("cpu", (1,))
for block in model.layers:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), 1e-3)
walked = []


def walk_now(_m, _a):  # the writer tick's walk, landing inside this forward
    if agent.stepclock.seen_step and not walked:
        walked.append(1)
        rec.inputs._find_at = -1e9
        rec.inputs.find_model(torch, agent.stepclock, rec.tracer)


model.layers[1].register_forward_pre_hook(walk_now)
for step in range(4):
    x = torch.randn(4, 8)
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
mm = rec.module_map()
print("RESULT " + json.dumps({"walked": bool(walked),
                              "root": None if mm is None else type(mm.model).__name__,
                              "is_model": mm is not None and mm.model is model}))
probe_agent.stop()
dist.destroy_process_group()
'''


def test_a_heap_walk_inside_an_fsdp2_forward_still_finds_the_model(tmp_path: Path):
    out = run_script_result(SCRIPT, str(tmp_path), timeout=180)
    assert out["walked"], out
    assert out["is_model"], out  # was 'FSDPBlock' or 'ModuleList'
