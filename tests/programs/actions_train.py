"""A seeded CPU training job for step-boundary actions (issue 6): LR changes, checkpoints, pause.

Every rank initialises the same model (seed 0), then draws its batches and dropout masks from
its own seeded generator (the default one), so RNG state matters for an exact resume. It logs
one JSON line per step to ``--log-dir/rank{N}.jsonl``: ``{"step", "lr": [LR used by each
optimizer in that step], "loss"}`` and writes ``rank{N}.json`` into ``--ready-dir`` after its
first step. It trains until ``--stop-file`` exists, or for ``--steps`` steps.

- ``--opt adamw|sgd``, ``--sched step|cosine|none``; ``--two-opts``: the first layer gets its
  own optimizer with a StepLR, the rest a second one with a CosineAnnealingLR (eta_min > 0).
- ``--no-ddp``: no gradient synchronisation (ranks step independently; used to hang one rank
  without blocking the other). Otherwise the model is wrapped in DistributedDataParallel.
- ``--hang-rank R --hang-after-step K``: rank R stops making progress after step K (it sleeps
  until the stop file appears), like a rank stuck outside any collective.
- ``--resume PATH``: load a probe checkpoint (probe_agent.actions.checkpoint.load), finish the
  iteration it was taken in (the scheduler step that follows optimizer.step()), and continue.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn

BATCH, DIM = 16, 8


def announce(ready_dir: str | None, rank: int) -> None:
    if not ready_dir:
        return
    info: dict[str, object] = {"rank": rank, "pid": os.getpid()}
    from probe_agent.process import current

    agent = current()
    if agent is not None:
        info.update(url=agent.url, unix_socket=agent.unix_path)
    path = os.path.join(ready_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(path + ".tmp", path)


def build(args: argparse.Namespace) -> None:
    """Defines the module-level names an operator would use: model, optimizer(s), scheduler(s)."""
    global net, model, optimizer, optimizers, schedulers, scheduler
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    model = net if args.no_ddp or not dist.is_initialized() else (
        nn.parallel.DistributedDataParallel(net))
    make = (lambda ps, lr: torch.optim.AdamW(ps, lr=lr)) if args.opt == "adamw" else (
        lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9))
    if args.two_opts:
        first = make(net[0].parameters(), 0.02)
        rest = make(list(net[3].parameters()), 0.01)
        optimizers = [first, rest]
        schedulers = [torch.optim.lr_scheduler.StepLR(first, step_size=10, gamma=0.5),
                      torch.optim.lr_scheduler.CosineAnnealingLR(rest, T_max=30, eta_min=1e-3)]
    else:
        optimizers = [make(net.parameters(), 0.02)]
        schedulers = {
            "step": lambda o: [torch.optim.lr_scheduler.StepLR(o, step_size=10, gamma=0.5)],
            "cosine": lambda o: [torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=30)],
            "none": lambda o: [],
        }[args.sched](optimizers[0])
    optimizer = optimizers[0]
    scheduler = schedulers[0] if schedulers else None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ready-dir")
    p.add_argument("--stop-file")
    p.add_argument("--log-dir", required=True)
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--step-sleep", type=float, default=0.02)
    p.add_argument("--opt", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--sched", choices=["step", "cosine", "none"], default="step")
    p.add_argument("--two-opts", action="store_true")
    p.add_argument("--no-ddp", action="store_true")
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-after-step", type=int, default=-1)
    p.add_argument("--resume")
    args = p.parse_args()
    torch.set_num_threads(1)
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    build(args)
    step = 0
    torch.manual_seed(100 + rank)  # this rank's data and dropout
    if args.resume:
        from probe_agent.actions.checkpoint import load, restore_rng

        state = load(args.resume, rank)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(state["scheduler"])
            scheduler.step()  # the checkpoint was taken right after optimizer.step()
        restore_rng(state["rng"])
        step = state["step"]
    os.makedirs(args.log_dir, exist_ok=True)
    log = open(os.path.join(args.log_dir, f"rank{rank}.jsonl"), "a", buffering=1)
    loss_fn = nn.MSELoss()
    end = step + args.steps
    while step < end:
        x = torch.randn(BATCH, DIM)
        y = x.sum(dim=1, keepdim=True) * 0.5
        for o in optimizers:
            o.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        lrs = [float(o.param_groups[0]["lr"]) for o in optimizers]
        for o in optimizers:
            o.step()
        for s in schedulers:
            s.step()
        step += 1
        log.write(json.dumps({"step": step, "lr": lrs, "loss": loss.item()}) + "\n")
        if step == 1 or (args.resume and step == end - args.steps + 1):
            announce(args.ready_dir, rank)
        if rank == args.hang_rank and step == args.hang_after_step:
            while not (args.stop_file and os.path.exists(args.stop_file)):
                time.sleep(0.05)  # stuck, outside any collective
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if should_stop(args):
            break
    log.close()
    if dist.is_initialized():
        release_process_group()


def release_process_group() -> None:
    """DDP's reducer holds the process group, so destroy_process_group alone leaves gloo's
    worker threads running into interpreter teardown, where one still freeing its last work's
    tensors needs the GIL and aborts the process (SIGABRT, "terminate called without an active
    exception"; torch PR 179291). Dropping DDP first makes destroy_process_group join them."""
    global model
    model = None
    gc.collect()  # DDP's hooks make cycles
    dist.destroy_process_group()


def should_stop(args: argparse.Namespace) -> bool:
    """With DDP every rank must leave at the same step, or one waits in the next all-reduce."""
    stop = bool(args.stop_file and os.path.exists(args.stop_file))
    if args.no_ddp or not dist.is_initialized():
        return stop
    flag = torch.tensor([1.0 if stop else 0.0])
    dist.all_reduce(flag)
    return bool(flag.item())


if __name__ == "__main__":
    main()
