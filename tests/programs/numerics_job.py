"""One labelled numerics condition of the verdict fault suite (bench/numerics_scenarios.py): a
2-rank DDP classifier on gloo, healthy or with exactly one numerics fault, chosen by
``--scenario``. Nothing is logged to the agent: the loss and gradients are what it records by
itself. The last rank is the odd one where a fault is on one rank.

Scenarios: num_healthy (AdamW 1e-3), num_clip_mild (clips most steps at a max_norm a little
below the typical norm, while the loss falls: fine), num_amp (bf16 autocast + GradScaler,
healthy), num_spike (one batch of the odd rank at ``--fault-step`` with wrong labels: a
finite spike; at step 200, once the net is confident), num_nan (one all-zero sample of the odd
rank at ``--fault-step``: the first module divides by its norm, 0/0), num_lr_high (AdamW at
0.3, no clipping), num_lr_low (AdamW at 1e-7), num_clip_small (clip_grad_norm_ max_norm
0.001), num_sched_end (a cosine schedule that reaches 0 at step 40 while the job runs on).

Every rank writes ``rank{N}.json`` into ``--ready-dir`` once ``--ready-step`` steps are done.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import ready  # tests/programs/ready.py, beside this script
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

CLASSES, DIM = 10, 32


class Rules(Dataset):
    """x ~ N(0, 1)^32, y = argmax of a fixed linear map: learnable, starts at ln(10)."""

    def __init__(self, n: int = 1 << 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.w = torch.randn(DIM, CLASSES, generator=g)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(DIM, generator=torch.Generator().manual_seed(i))
        return x, (x @ self.w).argmax()


class UnitNorm(nn.Module):
    """Scales each sample to unit RMS, without an epsilon: an all-zero sample is 0/0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.pow(2).mean(-1, keepdim=True).sqrt()


def digest(tensors: object) -> str:
    """A hash of the tensors' bytes: equal only when they are bit-identical."""
    h = hashlib.sha256()
    for t in tensors:  # type: ignore[attr-defined]
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(UnitNorm(), nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, CLASSES))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", required=True)
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--stop-file")
    p.add_argument("--ready-step", type=int, default=100)
    p.add_argument("--step-s", type=float, default=0.01)
    p.add_argument("--fault-step", type=int, help="the odd rank's faulty step (default 70; "
                   "num_spike 200: at step 70 the net is barely past chance, loss 2.0 against "
                   "ln 10 = 2.3, so a batch of wrong labels costs only x1.2 its median, which "
                   "is no spike; at 200 the loss is ~0.6 and the same batch costs ~x10)")
    p.add_argument("--fault-file", help="instead of --fault-step: the odd rank's first step "
                                        "after this file appears")
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--log-dir", help="one JSON line per step: step, loss, a hash of the "
                                     "parameters and of the optimizer state after it")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    odd = rank == world - 1
    sc = args.scenario
    fault_step = args.fault_step or (200 if sc == "num_spike" else 70)
    model = nn.parallel.DistributedDataParallel(build())
    lr = {"num_lr_high": 0.3, "num_lr_low": 1e-7}.get(sc, 1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=40, eta_min=0.0) \
        if sc == "num_sched_end" else None
    max_norm = {"num_clip_small": 1e-3, "num_clip_mild": 0.8}.get(sc)
    scaler = torch.amp.GradScaler("cpu") if sc == "num_amp" else None
    data = Rules()
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, world, rank))
    step, it, fault_at = 0, iter(loader), None
    log = open(os.path.join(args.log_dir, f"rank{rank}.jsonl"), "a", buffering=1) \
        if args.log_dir else None
    while step < args.max_steps and not (args.stop_file and os.path.exists(args.stop_file)):
        try:
            x, y = next(it)
        except StopIteration:  # the next epoch
            it = iter(loader)
            x, y = next(it)
        due = step + 1 == fault_step if not args.fault_file else (
            fault_at is None and os.path.exists(args.fault_file))
        if due:
            fault_at = step + 1
        if odd and due:
            if sc == "num_spike":
                y = (y + 3) % CLASSES  # a batch with wrong labels: finite, confidently wrong
            elif sc == "num_nan":
                x = x.clone()
                x[5] = 0.0
        time.sleep(args.step_s)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=scaler is not None):
            loss = nn.functional.cross_entropy(model(x).float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        else:
            loss.backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if sched is not None and sched.last_epoch < 40:
            sched.step()
        step += 1
        if log is not None:
            log.write(json.dumps({"step": step, "loss": loss.item(),
                                  "params": digest(model.parameters()),
                                  "state": digest(t for st in opt.state.values()
                                                  for t in st.values()
                                                  if isinstance(t, torch.Tensor))}) + "\n")
        if step == args.ready_step:
            ready.announce(args.ready_dir, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
