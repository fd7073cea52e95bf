"""StartGate: the step at which every FSDP2 rank starts the per-step agreement (sharded.py), found
through the job's store without a rank ever waiting for another.

Why not a barrier
-----------------
The agreement is one ``all_reduce`` per step: every rank must make its first one at the same
step, or one rank's all_reduce is matched against its peer's next FSDP2 all-gather (a hang).
Ranks do not take their first sharded step with the recorder at the same step: its optimizer
pre-hook is put in place by the agent's writer tick (a poll every 0.5 s, late on a loaded
machine), and an agent injected later (`probe inject`) starts when it is injected. The first
version asked at the first sharded step, blocking (StepAgreement, 10 s): a rank whose hook was
in place one step before its peer's waited in the hook while the peer waited for it in FSDP2's
next all-gather, so every such run stalled 10 s and ran without agreement (at load 9 a NaN born
on rank 1 was then named by rank 0's own re-run).

The protocol (keys under ``probe_actions/numerics-sharded.<torchrun restart>/``, on
StepAgreement's own store connection; only ``add``, ``set``, ``check``, ``compare_set`` and a
``get`` of a key known to be there: no call waits for another rank)
1. Announce: at its first sharded step ``r`` each rank sets ``ready/<rank>`` to ``r`` and adds 1
   to ``ready``. A step's number is the optimizer's own count + 1 (Adam's ``state["step"]``):
   the same on every rank at the same step, however late each agent started.
2. At each later step, while undecided: read the decision, else the counter (``add(ready,
   0)``). The first rank to see every rank counted reads the ``ready/*`` keys and writes
   ``go:S`` with ``compare_set`` (atomic: every rank reads back the same decision), ``S =
   max(r) + MARGIN``.
3. Each rank starts agreeing at its first step >= ``S``. Why ``MARGIN = 2`` is enough: the
   decision is there once the last rank to announce (at ``m = max(r)``) leaves its hook at
   ``m``; every other rank's hook at ``m + 1`` runs after that rank began step ``m + 1``'s
   all-gathers (FSDP2 ranks step in lockstep), so it reads the decision at ``m + 1`` at the
   latest, before ``S``. A step the GradScaler skips runs no hook on any rank (its inf check is
   all-reduced), so "the first step >= S" is the same step everywhere.

Off, the same answer on every rank (written with ``compare_set`` too): an optimizer that keeps
no step count (SGD: each agent would count from where it started), more arrivals than ranks or
a decision no rank writes (the store was written by someone else), or ``PENDING_S`` without
every rank (the agent on some ranks only: one store round trip per step until then, none
after). A store error leaves the rank undecided (it retries next step): deciding "off" alone
could leave the others in an all_reduce it never makes.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..actions.agreement import MAX_DECISION, StepAgreement, store_text

#: Steps between the last rank's announcement and the first agreed step (see the docstring).
MARGIN = 2
#: How long a rank waits (stepping, never blocked) for every rank to announce, from its own.
PENDING_S = 60.0


class StartGate:
    """One rank's side of the protocol (training thread only)."""

    def __init__(self, rank: int, world: int, agreement: StepAgreement | None = None,
                 key: str | None = None, pending_s: float = PENDING_S) -> None:
        self.rank, self.world = rank, world
        self.agreement = agreement or StepAgreement()
        run = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # torchrun restarts keep it
        self.key = key or f"numerics-sharded.{run}"
        self.pending_s = pending_s
        self.announced: int | None = None  # the step this rank announced at
        self.start: int | None = None  # S, once decided
        self.why: str | None = None  # "off" once decided so, and why
        self._since = 0.0
        self._stateless = 0  # pre-hooks that found no optimizer state
        self.errors = 0  # store errors while undecided (retried)

    @property
    def decided(self) -> bool:
        return self.start is not None or self.why is not None

    def poll(self, optimizer: Any) -> bool | None:
        """At a sharded step's pre-hook: True from the first step >= S on, False once off (then
        ``why``), None while undecided."""
        if self.why is not None:
            return False
        step, known = step_of(optimizer)
        if self.start is not None:
            return None if step is None or step < self.start else True
        if not known:  # no state yet: Adam before its first step; after one, a count-less one
            self._stateless += 1
            if self._stateless == 1:
                return None
        store = self.agreement.store()
        if store is None:
            return None
        try:
            if step is None:
                self._decide(store, "off:the optimizer keeps no step count (SGD): each agent "
                             "would count steps from where it started, so the ranks share no "
                             "step to start agreeing at")
                return False
            if self.announced is None:
                store.set(f"{self.key}/ready/{self.rank}", str(step))
                store.add(f"{self.key}/ready", 1)
                self.announced, self._since = step, time.monotonic()
            self._read(store)
        except Exception:  # noqa: BLE001 - a store hiccup: undecided, asked again next step
            self.errors += 1
            return None
        if self.start is not None:
            return True if step >= self.start else None
        return False if self.why is not None else None

    def withdraw(self) -> bool:
        """This rank's recorder stops before the agreement began: write "off" for every rank
        (unless "go" was written first: then ``start`` says where this rank must take part,
        to leave). False when the store did not answer (try again next step)."""
        if self.decided or self.announced is None:  # unannounced: the others never complete
            return True
        store = self.agreement.store()
        try:
            if store is not None:
                self._decide(store, "off:a rank's numerics recorder stopped before the "
                             "agreement began")
        except Exception:  # noqa: BLE001 - asked again at the next step
            self.errors += 1
            return False
        return True

    def _read(self, store: Any) -> str | None:
        """The decision when there is one (writing it when every rank has announced)."""
        key = f"{self.key}/decision"
        if store.check([key]):
            return self._take(store_text(store.get(key)))
        n = int(store.add(f"{self.key}/ready", 0))
        if n > self.world:
            return self._decide(store, f"off:{n} ranks announced for a job of {self.world}: "
                                "the job's store was written by someone else")
        if n == self.world:
            steps = [int(store_text(store.get(f"{self.key}/ready/{r}"))) for r in range(self.world)]
            return self._decide(store, f"go:{max(steps) + MARGIN}")
        if time.monotonic() - self._since > self.pending_s:
            return self._decide(store, f"off:only {n} of {self.world} ranks took part within "
                                f"{self.pending_s:g} s (the agent runs on some ranks only?)")
        return None

    def _decide(self, store: Any, vote: str) -> str:
        return self._take(store_text(store.compare_set(f"{self.key}/decision", "", vote)))

    def _take(self, decision: str) -> str:
        if decision.startswith("go:") and decision[3:].isdigit():
            self.start = int(decision[3:])
        elif decision.startswith("off:") and len(decision) <= MAX_DECISION:
            self.why = decision[4:]
        else:
            self.why = ("the decision in the job's store was not written by a rank (another "
                        "user of the store?)")
        return decision

    def state(self) -> dict[str, Any]:
        """``announced``: the step this rank said it takes part at; ``start``: the agreed first
        step (None while undecided); ``store_errors``: store calls that failed (retried)."""
        return {"announced": self.announced, "start": self.start, "store_errors": self.errors}


def step_of(optimizer: Any) -> tuple[int | None, bool]:
    """This step's number: the optimizer's own count + 1 (the Adam family keeps one per
    parameter: the first parameter with state), and whether the optimizer holds any state
    (none: before its first step, or an optimizer that keeps none)."""
    for group in getattr(optimizer, "param_groups", ()):
        for p in group["params"]:
            st = optimizer.state.get(p)
            if not st:
                continue
            count = st.get("step")
            if count is None:
                return None, True
            return int(count.item() if hasattr(count, "item") else count) + 1, True
    return None, False

