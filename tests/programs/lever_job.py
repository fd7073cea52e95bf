"""One labelled condition of the fault suite's throughput levers (bench/lever_scenarios.py,
bench/verdicts.py): a 2-rank DDP job on gloo with exactly one known cause of slow steps, or
healthy, chosen by ``--scenario``. The rank that misbehaves, where only one does, is the last.

Scenarios:
- lv_syncs: the loop logs 300 ``.item()`` values per step (every element of a tensor: the
  host-sync lever, named at its line);
- lv_small_ops: 300 tiny Linear layers, not compiled (per-op overhead: the torch.compile lever);
- lv_host_module: one module sleeps 20 ms in its forward (host code inside a module);
- lv_moe: a top-1 MoE whose router sends ~90% of tokens to expert 0 (experts 1-3 starve);
- lv_uneven: the last rank's batch is 3x the others' (a straggler, and why);
- lv_healthy: a healthy loop that logs its loss with ``.item()`` once a step;
- lv_moe_even: a healthy MoE with a balanced router;
- lv_moe_ep: expert parallelism over the 2 ranks (each holds 2 of 4 experts; tokens go to
  their expert's rank and back through all-to-all with uneven splits, as real EP code does),
  the router sending most tokens to expert 0, which rank 0 holds. Two layouts, one per
  layer: a plain ModuleList of the local experts with an ``ep_group`` on the block
  (DeepSpeed-MoE/megablocks-like) and stacked expert weights sharded on dim 0 as DTensors
  (torchtitan's ExpertParallel). Rank 0 computes most of every layer; rank 1 waits for it.

Like fault_job.py, each rank writes ``rank{N}.json`` into ``--ready-dir`` once ``--ready-step``
steps are done, and stops when ``--stop-file`` appears.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from fault_job import Tiny, announce  # same directory: the suite's shared helpers

import probe_agent


class SlowHost(nn.Module):
    """A layer whose forward waits 20 ms on host code (a stand-in for Python work or I/O)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)
        return self.fc(x)


class Moe(nn.Module):
    """Top-k MoE in plain code: gate + experts in a ModuleList."""

    def __init__(self, dim: int, experts: int = 4, top_k: int = 1, skew: float = 0.0) -> None:
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))
        with torch.no_grad():
            self.gate.bias.zero_()
            self.gate.bias[0] += skew  # lv_moe: expert 0 wins for most tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, idx = self.gate(x).softmax(-1).topk(self.top_k, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            hit = (idx == e).to(x.dtype)
            w = (weights * hit).sum(-1, keepdim=True)
            out = out + w * expert(x)
        return out


class MoeNet(nn.Module):
    def __init__(self, skew: float) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 64)
        self.blocks = nn.ModuleList(Moe(64, skew=skew) for _ in range(2))
        self.head = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = h + b(h)
        return self.head(h)


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits, differentiable (DeepSpeed's _AllToAll, with
    splits): backward sends the gradients back the way the tokens came."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):  # type: ignore[no-untyped-def]
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty(sum(out_splits), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        out_splits, in_splits = ctx.splits
        back = grad.new_empty(sum(in_splits), *grad.shape[1:])
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


class EpMoe(nn.Module):
    """A top-1 expert-parallel MoE layer: the router scores all ``num_experts``; this rank holds
    ``num_experts / world`` of them (contiguous), and tokens travel to their expert's rank and
    back. ``sharded``: torchtitan's layout (stacked weights, DTensor Shard(0) on a 1-D mesh);
    else DeepSpeed's (a ModuleList of the local experts and the block's ``ep_group``)."""

    def __init__(self, dim: int, experts: int, skew: float, sharded: bool) -> None:
        super().__init__()
        self.num_experts = experts
        self.ep_group = dist.group.WORLD
        self.world = dist.get_world_size()
        self.local = experts // self.world
        self.gate = nn.Linear(dim, experts)
        hidden = 4 * dim
        if sharded:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import Shard, distribute_tensor

            self.ep_group = None
            self.experts = GroupedExperts(experts, dim, hidden)
            mesh = init_device_mesh("cpu", (self.world,))
            for name, p in list(self.experts.named_parameters()):
                self.experts.register_parameter(
                    name, nn.Parameter(distribute_tensor(p.data, mesh, [Shard(0)])))
        else:
            self.experts = nn.ModuleList(
                nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))
                for _ in range(self.local))
        with torch.no_grad():
            self.gate.bias.zero_()
            self.gate.bias[0] += skew

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, idx = self.gate(x).softmax(-1).max(-1)
        order = idx.argsort()
        sent = torch.bincount(idx, minlength=self.num_experts)  # tokens to each expert
        got = torch.empty_like(sent)  # from each source rank, to each of my local experts
        dist.all_to_all_single(got, sent)
        in_splits = sent.view(self.world, self.local).sum(1).tolist()
        out_splits = got.view(self.world, self.local).sum(1).tolist()
        recv = _AllToAll.apply(x[order], out_splits, in_splits, None)
        chunks = recv.split(got.tolist())  # (source rank, local expert) blocks
        outs = [self._expert(j % self.local, c) for j, c in enumerate(chunks)]
        back = _AllToAll.apply(torch.cat(outs), in_splits, out_splits, None)
        out = torch.empty_like(back).index_copy(0, order, back)
        return out * weight.unsqueeze(-1)

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.experts, nn.ModuleList):
            return self.experts[e](x)
        return self.experts(e, x)


class GroupedExperts(nn.Module):
    """torchtitan's GroupedExperts, reduced: every expert's weights stacked on dim 0."""

    def __init__(self, experts: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.num_experts = experts
        self.w1 = nn.Parameter(torch.randn(experts, dim, hidden) / dim ** 0.5)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, dim) / hidden ** 0.5)

    def forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        w1, w2 = self.w1.to_local()[e], self.w2.to_local()[e]  # type: ignore[attr-defined]
        return torch.relu(x @ w1) @ w2


class EpNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 64)
        self.blocks = nn.ModuleList(EpMoe(64, 4, skew=2.0, sharded=i == 1) for i in range(2))
        self.head = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = h + b(h)
        return self.head(h)


def _sync_dense(model: nn.Module) -> None:
    """Data parallelism for the parameters every rank holds (the experts are each rank's own):
    one all-reduce of their gradients, flattened."""
    grads = [p.grad for n, p in model.named_parameters()
             if p.grad is not None and ".experts." not in n]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for g, v in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(v.view_as(g))


def build(sc: str) -> nn.Module:
    if sc == "lv_small_ops":
        return Tiny()
    if sc == "lv_host_module":
        return nn.Sequential(nn.Linear(16, 256), SlowHost(256), nn.Linear(256, 1))
    if sc in ("lv_moe", "lv_moe_even"):
        return MoeNet(skew=4.0 if sc == "lv_moe" else 0.0)
    if sc == "lv_uneven":  # compute that grows with the batch: 3x the batch, ~3x the step
        return nn.Sequential(nn.Linear(16, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                             nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1))
    return nn.Sequential(nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", required=True)
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--stop-file")
    p.add_argument("--ready-step", type=int, default=40)
    p.add_argument("--step-s", type=float, default=0.0, help="unused: the suite passes it")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    odd = rank == world - 1
    sc = args.scenario
    torch.manual_seed(0)
    ep = sc == "lv_moe_ep"
    model = EpNet() if ep else nn.parallel.DistributedDataParallel(build(sc))
    # fault_job.py's optimizer: a 300-layer model still learns (doctor's numerics stay quiet)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch = 16 if sc == "lv_small_ops" else 64 * (3 if sc == "lv_uneven" and odd else 1)
    if sc == "lv_healthy":
        batch = 256  # tp_healthy's: large matmuls, compute dominates
    if sc == "lv_uneven":
        batch *= 2
    if ep:
        batch = 256
    gen = torch.Generator().manual_seed(rank)
    step = 0
    total = 0.0
    while not (args.stop_file and os.path.exists(args.stop_file)):
        x = torch.randn(batch, 16, generator=gen)
        y = x[:, :1] * 3.0
        out = model(x)
        loss = nn.functional.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        if ep:
            _sync_dense(model)
        opt.step()
        if sc == "lv_syncs":
            per_sample = (out - y).detach().abs().flatten()
            for i in range(300):  # logging every sample's error, one .item() each
                total += per_sample[i % per_sample.numel()].item()
        elif sc == "lv_healthy":
            total += loss.item()  # the usual once-a-step logging
        probe_agent.log(loss=loss.detach())
        step += 1
        if step == args.ready_step:
            announce(args.ready_dir, step)


if __name__ == "__main__":
    main()
