"""Sharded parameters (FSDP2): the ranks agree on each step's gradient norm and on whether the
step was non-finite, so that the NaN hunt (nan_hunt.py) can re-run the bad step on every rank
at once.

Why an agreement at all
-----------------------
Under DDP every rank holds every gradient: a NaN born on one rank reaches every rank's norm in
the same all-reduce, so each rank sees it and re-runs its own batch without any collective.
Under FSDP2 a rank holds a shard of each gradient (a DTensor's local tensor): the norm each rank
can compute alone covers its shard only, and a NaN in one parameter's gradient reaches only the
rank that owns that part. A re-run of the forward all-gathers every sharded module's weights,
so it must run on every rank or on none: one rank re-running alone would wait forever.

So, on sharded parameters only, one ``all_reduce(SUM)`` of two numbers per step, over the
default group, right where the numbers are taken (the first ``optimizer.step()`` of the step,
where every rank is by then: FSDP2's ranks step in lockstep): the squares of the local shard
norms (their sum is the square of the whole model's gradient norm: the recorded norm is then
the one ``clip_grad_norm_`` would print, not a shard's) and a flag per rank whose loss or
gradients were non-finite. A NaN propagates through the sum, so every rank reads the same
answer. That is the per-step cost on FSDP2 (a scalar collective beside the two per sharded
module that FSDP2 runs every step anyway); without sharded parameters nothing is added.

Never a hang of the tool's making: the collective runs only from a step every rank agreed on
through the job's store (``StartGate``, sharded_start.py: never a wait on another rank; a rank
without the agent, or with the recorder off, never says so, and the others then read "off",
the same answer everywhere). Once on, a rank whose recorder stops (switched off after
failures, or the agent stopped) takes part once more with a "leaving" flag, and every rank
stops at that same step. ``Agreement`` is one rank's state through all of it.
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any

from .sharded_start import StartGate

log = logging.getLogger(__name__)


def is_sharded(optimizer: Any) -> bool:
    """Whether the optimizer steps DTensor parameters (FSDP2) in a distributed job of 2+
    ranks. Whether every rank takes part is the start gate's to say: PROBE=1 in the launch
    environment is not enough (a node launched without it, an agent that failed to start on
    one rank), and an agent injected later (`probe inject`) into every rank is welcome once all
    of them say so."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or \
            dist.get_world_size() < 2:
        return False
    for g in getattr(optimizer, "param_groups", ()):
        for p in g["params"]:
            return type(p).__name__ == "DTensor"
    return False


class Agreement:
    """One rank's FSDP2 agreement (training thread): undecided until the start gate decides,
    then ``on`` (one ``agree`` per step) until a rank leaves, or ``off`` (why) for good."""

    def __init__(self, rank: int, world: int, gate: StartGate | None = None) -> None:
        self.gate = gate or StartGate(rank, world)
        self.on = False
        self.off: str | None = None  # why the ranks do not agree (None while on or undecided)
        self.agreed = False  # this step's agree ran (the recorder resets it at each step)

    @staticmethod
    def of(optimizer: Any) -> Agreement | None:
        """A new agreement when the optimizer steps DTensor parameters in a job of 2+ ranks."""
        if not is_sharded(optimizer):
            return None
        dist = sys.modules["torch.distributed"]
        return Agreement(dist.get_rank(), dist.get_world_size())

    def poll(self, optimizer: Any) -> bool:
        """Whether this step is agreed (call at every sharded step's pre-hook, before
        ``agree``)."""
        if not self.on and self.off is None:
            started = self.gate.poll(optimizer)
            self.on = bool(started)
            if started is False:
                self.off = self.gate.why
                log.warning("probe agent: FSDP2 numerics agreement off (%s): each rank's "
                            "gradient norm is its shard's, and a NaN's module is not re-run",
                            self.off)
        return self.on

    def agree(self, torch: Any, loss: float | None, norm: float | None, local_norm: bool,
              calls: int) -> tuple[float | None, bool, bool]:
        """This agreed step's ``agree`` (below): the norm, any rank non-finite, every rank can
        re-run it. A rank that left stops every rank here."""
        self.agreed = True
        norm, bad, rerun, stay = agree(torch, loss, norm, local_norm, calls)
        if not stay:
            self.stopped("a rank's numerics recorder stopped")
        return norm, bad, rerun

    @property
    def bound(self) -> bool:
        """Whether the other ranks count on this one (on, or announced and not off): a
        recorder that stops must ``leave`` first."""
        return self.off is None and self.gate.announced is not None

    def stopped(self, why: str) -> None:
        """Every rank stopped agreeing at this step (a rank left)."""
        self.on, self.off = False, why

    def leave(self, torch: Any, optimizer: Any) -> bool:
        """This rank's recorder stops: leave with the others (sharded.py's docstring). Returns
        True while the rank must come back at a later step's pre-hook (the ranks agreed to
        start at a step not reached yet, or the store did not answer)."""
        why = "a rank's numerics recorder stopped"
        if not self.on and self.off is None:
            if self.gate.start is None:
                if not self.gate.withdraw():
                    return True  # the store did not answer: try again next step
                if self.gate.start is None:
                    self.off = why
                    return False
            if not self.poll(optimizer):
                return self.off is None  # the agreed start is ahead: take part there, to leave
        if self.on:
            self.stopped(why)
            self.agreed = True
            agree(torch, None, None, False, 0, leaving=True)
        return False

    def state(self) -> dict[str, Any]:
        return {**self.gate.state(), "on": self.on, "off": self.off}


def agree(torch: Any, loss: float | None, norm: float | None, local_norm: bool,
          calls: int, leaving: bool = False) -> tuple[float | None, bool, bool, bool]:
    """The whole model's gradient norm (from each rank's shard norm when ``local_norm``; a
    clip's norm is already the whole model's), whether any rank's loss or norm was non-finite
    this step, and whether every rank can re-run it (``calls``: the root calls this rank kept,
    0 when it cannot re-run: all must be equal and not 0), and whether every rank stays in
    (False once any rank is ``leaving``: then no rank calls this again). One all_reduce over
    the default group: call on every rank."""
    dist = sys.modules["torch.distributed"]
    bad = (loss is not None and not math.isfinite(loss)) or \
        (norm is not None and not math.isfinite(norm))
    square = norm * norm if local_norm and norm is not None and not bad else 0.0
    dev = "cpu"
    if "nccl" in str(dist.get_backend()):
        dev = f"cuda:{torch.cuda.current_device()}"
    # the calls' count and its square: equal on every rank iff n * sum(c^2) == sum(c)^2
    t = torch.tensor([square, 1.0 if bad else 0.0, 1.0, float(calls), float(calls) ** 2,
                      1.0 if leaving else 0.0], dtype=torch.float64, device=dev)
    dist.all_reduce(t)
    total, flags, n, c, c2, left = (float(x) for x in t.tolist())
    any_bad = flags > 0 or not math.isfinite(total)
    stay = left == 0
    rerun = c > 0 and abs(n * c2 - c * c) < 0.5 and calls > 0 and stay
    if not local_norm or norm is None:
        return norm, any_bad, rerun, stay
    return (math.nan if any_bad else math.sqrt(total)), any_bad, rerun, stay


def reshard(model: Any) -> None:
    """Put every FSDP2 module's parameters back to their shards after a re-run (the root keeps
    its weights gathered after a forward; the optimizer steps the shards, and a module left
    gathered would run its next forward on the weights of before the step)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()
