"""A torchtitan-style FSDP2 job (issue 17): ``fully_shard`` on each block, then on the root, on 2
gloo ranks under torchrun (CPU). Parameters are DTensors sharded over the ranks; AdamW and a
LambdaLR (linear warmup, then linear decay: torchtitan's shape) step on the shards; batches come
from a DataLoader named ``dataloader`` (not ``train_loader``: discovery must find it).

The model is ``Net``: ``embed``, ``layers.N`` (``Block``: ``attn``, ``mlp`` with ``fc1``/``fc2``),
``head``. A plain loop; after every optimizer step it does what fw_common.StepLog describes
(``global_step`` is the loop's own count; ``param_sum`` is the sum of this rank's local shards).
``--slow-module layers.1.mlp --slow-ms 20`` makes that layer's forward slow. ``--nan-file F``:
the model starts with ``norm`` (``UnitNorm``: each sample scaled to unit RMS, no epsilon, no
parameters), and at the first step after ``F`` appears one sample of the last rank's batch is
all zeros: 0/0 in ``norm``, a NaN born there on that rank (the gradient reduce-scatter then
spreads it to every rank's shards).
``--verify-checkpoint DIR`` (under torchrun too) builds a fresh sharded model, optimizer and
scheduler, loads a probe checkpoint (``torch.distributed.checkpoint``) into them, prints
``PROBE-VERIFY {json}`` per rank and exits.

Run: ``PROBE=1 torchrun --nproc-per-node=2 tests/programs/fw_fsdp2.py --ready-dir D --stop-file F``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from fw_common import StepLog, add_common_args, make_slow, param_sum, print_json, rank
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

DIM, LAYERS, BATCH, LR, WARMUP, TOTAL = 32, 2, 8, 1e-3, 5, 2000


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential()
        self.mlp.add_module("fc1", nn.Linear(DIM, 2 * DIM))
        self.mlp.add_module("act", nn.GELU())
        self.mlp.add_module("fc2", nn.Linear(2 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


class UnitNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.pow(2).mean(-1, keepdim=True).sqrt()


class Net(nn.Module):
    def __init__(self, norm: bool = False) -> None:
        super().__init__()
        self.norm = UnitNorm() if norm else nn.Identity()
        self.embed = nn.Linear(DIM, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(self.norm(x))
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def warmup_then_decay(step: int) -> float:
    """A multiplier of the base LR, as torchtitan's schedule returns."""
    if step < WARMUP:
        return (step + 1) / WARMUP
    return max(0.0, 1.0 - (step - WARMUP) / (TOTAL - WARMUP))


def build(args: argparse.Namespace) -> tuple[Net, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = Net(norm=bool(getattr(args, "nan_file", None)))
    make_slow(model, args.slow_module, args.slow_ms)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_decay)
    return model, optimizer, scheduler


def verify(args: argparse.Namespace, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, optimizer, scheduler = build(args)
    fresh = param_sum(model)
    msd, osd = get_state_dict(model, [optimizer])
    state = {"model": msd, "optimizer": osd, "step": 0, "scheduler.0": scheduler.state_dict(),
             "framework": ""}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, [optimizer], model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    scheduler.load_state_dict(state["scheduler.0"])
    steps = {int(s["step"]) for s in optimizer.state.values()}
    print_json({"rank": rank(), "step": state["step"], "framework": state["framework"],
                "fresh_param_sum": fresh,
                "param_sum": param_sum(model), "optimizer_steps": sorted(steps),
                "scheduler_last_epoch": scheduler.last_epoch,
                "lr": float(optimizer.param_groups[0]["lr"]),
                "scheduler_lr": scheduler.get_last_lr()[0]})


def main() -> None:
    p = argparse.ArgumentParser()
    add_common_args(p)
    p.add_argument("--nan-file", help="a NaN born in module 'norm' on the last rank once this "
                                      "file exists")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        if args.verify_checkpoint:
            verify(args, args.verify_checkpoint)
            return
        model, optimizer, scheduler = build(args)
        log = StepLog(args)
        g = torch.Generator().manual_seed(100 + rank())  # each rank its own data
        xs = torch.randn(256, DIM, generator=g)
        dataloader = DataLoader(TensorDataset(xs, xs.sum(dim=1, keepdim=True) * 0.1),
                                batch_size=BATCH, shuffle=True, generator=g)
        batches = iter(dataloader)
        global_step, nan_done = 0, False
        while global_step < args.max_steps:
            try:
                x, y = next(batches)
            except StopIteration:  # next epoch
                batches = iter(dataloader)
                x, y = next(batches)
            if args.nan_file and not nan_done and os.path.exists(args.nan_file):
                nan_done = True
                if rank() == dist.get_world_size() - 1:
                    # which dataset sample it was: the test checks the one probe names
                    at = int((xs == x[3]).all(dim=1).nonzero()[0])
                    with open(args.nan_file + ".sample", "w") as f:
                        f.write(str(at))
                    x = x.clone()
                    x[3] = 0.0
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            global_step += 1
            stop = log.step_done(global_step, float(optimizer.param_groups[0]["lr"]), model)
            # every rank must stop at the same step, or one would wait in a collective forever
            flag = torch.tensor([1.0 if stop else 0.0])
            dist.all_reduce(flag)
            if flag.item() > 0:
                break
    finally:
        dist.barrier()  # without it, gloo sometimes aborts at exit ("terminate called ...")
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
