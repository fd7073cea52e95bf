"""StepGuard: rules checked right before every optimizer step, armed by `probe guard`.

Armed by a step-boundary action (kinds/guard.py) at the same step N on every rank, so from step
N+1 on every rank runs the same check at the same point: the numerics recorder's pre-hook, in
the first ``optimizer.step()`` of each step, with the step's loss and total gradient norm
(collectors/numerics.py). Rules:

- ``skip_nonfinite``: the loss or the gradient norm is NaN/Inf;
- ``skip_spike K``: the loss is above K x the median of the last 50 finite losses (10 needed).

When a rule holds on any rank, the ranks agree first: one ``all_reduce(MAX)`` of a flag over
the default process group, every step while the guard is armed (the only cost on a healthy
step; none when the job is not distributed). Then on every rank, as configured:

- ``checkpoint PATH``: save a checkpoint before the step (the weights that made it), as
  `probe checkpoint` does (kinds/checkpoint.py), to ``PATH/guard-step<N>``;
- the step is skipped: every gradient of every optimizer seen stepping is set aside
  (``p.grad = None``), so ``optimizer.step()`` updates nothing: no weight, no moment, no
  per-parameter step count changes (torch's optimizers skip parameters without a gradient),
  and the gradients are put back right after, where the script's ``zero_grad`` finds them;
- ``lower_lr F``: every LR is multiplied by F after the skipped step (schedulers rescaled
  too: actions/lr.py), once per firing.

Every firing is a row of ``python.audit`` (kind 'guard', outcome 'fired', the rule, the
numbers, what was done) and is listed in ``GET /v1/numerics`` (doctor shows it). The guard is
disarmed by the same action with ``off``; it lives in the process and ends with it.
What it does not cover: DeepSpeed's engine steps (ZeRO holds the gradients in its own
partitions) and a GradScaler that already skipped the step (its own inf check).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from typing import Any

#: Firings kept for /v1/numerics (all are audited).
KEEP = 50


class StepGuard:
    """One armed set of rules; ``check`` is the numerics recorder's ``on_check``."""

    def __init__(self, rules: dict[str, Any], armed_at: int, action_id: str, audit: Any,
                 optimizers: Any, checkpoint: Any) -> None:
        self.rules = rules
        self.armed_at = armed_at
        self.action_id = action_id
        self.audit = audit  # (code, outcome, error, at_step) -> None
        self.optimizers = optimizers  # () -> the optimizers seen stepping
        self.checkpoint = checkpoint  # (path, step) -> str: what was saved
        self.firings: list[dict[str, Any]] = []
        self.fired = 0
        self._stash: list[tuple[Any, Any]] = []
        self.checks = 0

    def state(self) -> dict[str, Any]:
        return {"rules": dict(self.rules), "armed_at": self.armed_at, "checks": self.checks,
                "fired": self.fired, "firings": list(self.firings[-KEEP:]),
                "action_id": self.action_id}

    # -- training thread, inside the first optimizer.step() of a step ---------------------------
    def check(self, numbers: dict[str, Any], recent: list[float], step: int) -> None:
        self.checks += 1
        reasons = self._reasons(numbers, recent)
        if not _agree(bool(reasons)):
            return
        self.fired += 1
        done = []
        path = self.rules.get("checkpoint")
        if path:
            try:
                done.append(f"checkpoint {self.checkpoint(path, step)}")
            except Exception as e:  # noqa: BLE001 - reported; the skip still protects
                done.append(f"checkpoint failed: {type(e).__name__}: {e}")
        if self.rules.get("skip", True):
            self._set_aside()
            done.append("optimizer step skipped")
        lower = self.rules.get("lower_lr")
        if lower:
            done.append(self._lower(float(lower)))
        why = "; ".join(reasons) or "another rank's rule held"
        firing = {"step": step, "why": why, "done": done, "time": time.time()}
        self.firings.append(firing)
        del self.firings[:-KEEP]
        self.audit(f"guard fired at step {step}: {why}; {', '.join(done)}", "fired", None,
                   step)

    def after_step(self) -> None:
        """Right after the step (numerics recorder's subscriber): put the gradients back."""
        stash, self._stash = self._stash, []
        for p, g in stash:
            p.grad = g

    def _reasons(self, n: dict[str, Any], recent: list[float]) -> list[str]:
        out = []
        if self.rules.get("skip_nonfinite") and n.get("nonfinite"):
            out.append(f"non-finite (loss {n.get('loss')}, gradient norm {n.get('grad_norm')})")
        k = self.rules.get("skip_spike")
        loss = n.get("loss")
        if k and loss is not None and math.isfinite(loss) and len(recent) >= 10:
            med = statistics.median(recent)
            if med > 0 and loss > float(k) * med:
                out.append(f"loss {loss:.4g} = x{loss / med:.1f} the median {med:.4g} of the "
                           f"last {len(recent)} steps (rule: above x{float(k):g})")
        return out

    def _set_aside(self) -> None:
        for opt in self.optimizers():
            for g in getattr(opt, "param_groups", ()):
                for p in g["params"]:
                    if p.grad is not None:
                        self._stash.append((p, p.grad))
                        p.grad = None

    def _lower(self, factor: float) -> str:
        from ..frameworks.discovery import discover
        from .lr import change_lr

        d = discover(optimizers=self.optimizers())
        report = change_lr(d.optimizers, d.schedulers, scale=factor, set_to=None, force=False,
                           names=d.where)
        lrs = [f"{g['before']:.3g} -> {g['after']:.3g}" for o in report["optimizers"]
               for g in o["groups"]]
        return f"LR x{factor:g} ({', '.join(lrs[:3])})"


def _agree(mine: bool) -> bool:
    """Whether any rank's rule held: one all_reduce(MAX) of a flag over the default group."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or \
            dist.get_world_size() == 1:
        return mine
    torch = sys.modules["torch"]
    backend = str(dist.get_backend())
    dev = f"cuda:{torch.cuda.current_device()}" if "nccl" in backend else "cpu"
    flag = torch.tensor([1.0 if mine else 0.0], device=dev)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)
