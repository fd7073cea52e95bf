"""A DeepSpeed job as its users write it: ``deepspeed.initialize`` over a small GPT-shaped model
(``h.0.attn``, ``h.1.mlp``...), ZeRO stage 2 or 3, gradient accumulation, one of DeepSpeed's own
LR schedulers, the CPU accelerator on gloo (the recipe that runs DeepSpeed without a GPU).

The loop is DeepSpeed's: ``loss = engine(x); engine.backward(loss); engine.step()`` per micro
batch; ``engine.step()`` updates the weights only on the micro step that ends an accumulation.
The engine is called ``engine`` (not ``model``), the torch optimizer and the scheduler have no
script names at all, as in DeepSpeed's examples.

After every optimizer step (``engine.is_gradient_accumulation_boundary()`` before ``step()``)
fw_common.StepLog writes ``global_step`` = ``engine.global_steps``, the LR the next step uses and
the sum of the full (gathered under ZeRO-3) parameters.

- ``--hang-file PATH``: once PATH exists, rank 1 sleeps in ``do_hang`` before the next step's
  forward until the stop file appears (rank 0 then waits in that step's first collective; the
  test's teardown ends the job cleanly instead of waiting out its stop and killing it).
- ``--verify-checkpoint PATH``: load a probe checkpoint's ``model`` strictly into a fresh
  ``GPT`` (no DeepSpeed), print ``PROBE-VERIFY {json}``, exit.

Run: ``DS_ACCELERATOR=cpu PROBE=1 torchrun --nproc-per-node 2 fw_deepspeed.py --stage 3``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
import warnings

import torch

# Known open defect, not hidden: in 2 of about 6 clean-clone CI runs both ZeRO-3 ranks died in
# deepspeed.initialize -> AdamW -> (lazy) `import torch._dynamo` with "cannot import name
# 'IndentedBuffer' from partially initialized module 'torch._inductor.utils'": another thread
# was importing torch._inductor at that moment (Python 3.11's import deadlock detection hands
# one of them the partial module). 15 instrumented runs never reproduced it nor showed an agent
# thread importing torch. Importing dynamo here, before DeepSpeed starts, keeps this suite
# about what it tests; the open bug is recorded in docs/known-issues.md.
import torch._dynamo  # noqa: F401,E402
import torch.nn as nn
from fw_common import StepLog, add_common_args, announce, make_slow, verify_consolidated

DIM, VOCAB, LR = 32, 64, 1e-3


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.h = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        logits = self.head(x)
        return nn.functional.cross_entropy(logits.view(-1, VOCAB), idx.roll(1, 1).view(-1))


def scheduler_config(kind: str, accum: int) -> dict:
    if kind == "WarmupLR":
        return {"type": "WarmupLR", "params": {"warmup_min_lr": LR / 10, "warmup_max_lr": LR,
                                                "warmup_num_steps": 10, "warmup_type": "linear"}}
    if kind == "WarmupDecayLR":
        return {"type": "WarmupDecayLR", "params": {
            "warmup_min_lr": LR / 10, "warmup_max_lr": LR, "warmup_num_steps": 10,
            "total_num_steps": 100_000, "warmup_type": "linear"}}
    raise SystemExit(f"unknown --scheduler {kind}")


def ds_config(args: argparse.Namespace) -> dict:
    zero: dict = {"stage": args.stage}
    if args.stage == 3:
        zero["stage3_param_persistence_threshold"] = 0  # partition even this tiny model
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": args.accum,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "Adam", "params": {"lr": LR, "torch_adam": True}},
        "scheduler": scheduler_config(args.scheduler, args.accum),
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }


def full_param_sum(engine: object, stage: int) -> float:
    import deepspeed

    params = list(engine.module.parameters())
    if stage == 3:
        with deepspeed.zero.GatheredParameters(params):
            return float(sum(p.detach().double().sum() for p in params))
    return float(sum(p.detach().double().sum() for p in params))


def do_hang(stop_file: str | None) -> None:
    while not (stop_file and os.path.exists(stop_file)):
        time.sleep(0.5)


def train(args: argparse.Namespace) -> None:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    net = GPT()
    make_slow(net, args.slow_module, args.slow_ms)
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                           config=ds_config(args))
    log = StepLog(args)
    rank = int(os.environ.get("RANK", "0"))
    g = torch.Generator().manual_seed(rank)
    micro = 0
    losses: list[float] = []  # the micro-batches' losses given to engine.backward this step
    while True:
        idx = torch.randint(0, VOCAB, (4, 8), generator=g)
        boundary = engine.is_gradient_accumulation_boundary()
        if boundary and rank == 1 and args.hang_file and os.path.exists(args.hang_file):
            do_hang(args.stop_file)
        loss = engine(idx)
        engine.backward(loss)
        losses.append(float(loss))
        engine.step()
        micro += 1
        if boundary:
            lr = float(engine.get_lr()[0])
            if log.f is not None:
                log.f.write(json.dumps({"global_step": engine.global_steps, "lr": lr,
                                        "param_sum": full_param_sum(engine, args.stage),
                                        "micro": micro,
                                        "loss": sum(losses) / len(losses)}) + "\n")
            losses = []
            if not log.announced:
                log.announced = True
                announce(args.ready_dir)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if os.path.exists(args.stop_file or "/nonexistent") or (
                    engine.global_steps >= args.max_steps):
                break


def verify(path: str) -> None:
    verify_consolidated(path, GPT(), scheduler_last_batch_iteration=lambda state: (
        state.get("scheduler") or {}).get("last_batch_iteration"))


def main() -> None:
    p = argparse.ArgumentParser()
    add_common_args(p)
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--scheduler", default="WarmupDecayLR")
    p.add_argument("--hang-file")
    p.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    args = p.parse_args()
    if args.verify_checkpoint:
        verify(args.verify_checkpoint)
        return
    warnings.filterwarnings("ignore")
    train(args)
    # DeepSpeed's imports leave millions of objects: the collection at interpreter exit took
    # ~10 s of the test's teardown on a loaded machine. Exempt them (the agent's own end
    # handling runs at exit as before).
    gc.freeze()


if __name__ == "__main__":
    main()
