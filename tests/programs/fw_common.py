"""What the framework test programs (fw_hf_trainer.py, fw_lightning.py, fw_fsdp2.py) share.

- ``add_common_args``: ``--ready-dir``, ``--stop-file``, ``--log-dir``, ``--step-sleep``,
  ``--max-steps``, ``--slow-module QUALIFIED.NAME --slow-ms N``, ``--verify-checkpoint PATH``.
- ``announce``: atomically writes ``rank{N}.json`` ({rank, pid, url, unix_socket}) into
  ``--ready-dir`` once the first optimizer step is done (the readiness handshake of the e2e
  tests; never a sleep).
- ``make_slow``: a forward pre-hook on that submodule that sleeps ``--slow-ms`` per call, so
  `probe slow` has a known culprit with a full qualified name.
- ``StepLog``: one JSON line per optimizer step in ``--log-dir/rank{N}.jsonl``:
  ``{"global_step": the framework's own count, "lr": LR the next step will use, "param_sum":
  sum of this rank's parameters (local shards under FSDP2) after the step}``. Tests compare
  `probe steps`, `probe lr` and `probe checkpoint` against it.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time
from typing import Any

import ready  # tests/programs/ready.py, beside this script


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ready-dir")
    p.add_argument("--stop-file")
    p.add_argument("--log-dir")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds slept per step")
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--slow-module", help="qualified name of a submodule whose forward is slow")
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--verify-checkpoint", metavar="PATH",
                   help="load a probe checkpoint into a fresh setup, print JSON, exit")


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def announce(ready_dir: str | None) -> None:
    ready.announce(ready_dir, rank())


def make_slow(root: Any, name: str | None, ms: float) -> None:
    """Sleep ``ms`` before every forward of ``root.get_submodule(name)``."""
    if not name or ms <= 0:
        return
    sub = root.get_submodule(name)

    def pre_hook(module: Any, inputs: Any) -> None:
        time.sleep(ms / 1e3)  # host-side work inside this layer, as a slow tokenizer would be

    sub.register_forward_pre_hook(pre_hook)


def param_sum(model: Any) -> float:
    """Sum of this rank's parameter values (a DTensor's local shard under FSDP2)."""
    total = 0.0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += float(local.detach().double().sum())
    return total


class StepLog:
    """Appends one JSON line per optimizer step; also handles readiness, sleep and stop."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.f = None
        if args.log_dir:
            os.makedirs(args.log_dir, exist_ok=True)
            self.f = open(os.path.join(args.log_dir, f"rank{rank()}.jsonl"), "a", buffering=1)
        self.announced = False

    def step_done(self, global_step: int, lr: float, model: Any) -> bool:
        """Call after each optimizer step; returns True when the stop file exists."""
        if self.f is not None:
            self.f.write(json.dumps({"global_step": global_step, "lr": lr,
                                     "param_sum": param_sum(model)}) + "\n")
        if not self.announced:
            self.announced = True
            announce(self.args.ready_dir)
        if self.args.step_sleep:
            time.sleep(self.args.step_sleep)
        return bool(self.args.stop_file) and os.path.exists(self.args.stop_file)


def print_json(obj: dict[str, Any]) -> None:
    """One ``os.write`` per record: the ranks share torchrun's stdout, and print's two writes
    (text, then newline) of two ranks interleaved into one unparseable line under load."""
    line = ("PROBE-VERIFY " + json.dumps(obj) + "\n").encode()
    assert len(line) <= select.PIPE_BUF, "longer records are not written atomically to a pipe"
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), line)


def verify_consolidated(path: str, fresh: Any, **extra: Any) -> None:
    """Load a probe checkpoint's consolidated ``model`` strictly into ``fresh`` (a new model of
    the job's class, no framework around it) and print ``PROBE-VERIFY`` with the step, the
    framework, the parameter sums after and before loading, every weight's shape and the
    checkpoint's ``scheduler`` and ``written``, plus ``extra(state)`` for each callable."""
    import torch

    state = torch.load(path, weights_only=False, map_location="cpu")
    fresh_sum = param_sum(fresh)
    fresh.load_state_dict(state["model"], strict=True)
    print_json({"step": state.get("step"), "framework": state.get("framework"),
                "param_sum": param_sum(fresh), "fresh_param_sum": fresh_sum,
                "shapes": sorted({tuple(v.shape) for v in state["model"].values()}),
                "scheduler": state.get("scheduler"), "written": state.get("written"),
                **{k: f(state) for k, f in extra.items()}})
