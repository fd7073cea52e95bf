"""StepAgreement: a step-boundary action runs on every targeted rank at the same step, or nowhere.

The problem: an action queued for step N on every rank runs when each rank finishes step N. If
one rank never gets there (it is hung, or it crashed), the others would run the action alone. An
action with a collective inside (a sharded checkpoint, an eval that calls all_reduce) would then
block those ranks forever: a new hang, caused by the tool meant to diagnose hangs.

The agreement, through the job's own c10d store (a connection of our own, cloned from the
default store; never a blocking ``get``):

1. each rank that reaches the step adds 1 to ``probe_actions/<id>/arrived``;
2. it polls that counter (``add(key, 0)``) until every rank of the action's group has arrived,
   the action is cancelled, or PROBE_ACTION_TIMEOUT_S passes;
3. the first rank to decide writes the decision with ``compare_set(<id>/decision, "", ...)``:
   ``go`` if everyone arrived, else ``abort:<why>``. ``compare_set`` is atomic in the store, so
   every rank, early or late, reads back the *same* decision and follows it. A rank that arrives
   after an abort skips the action too.

Cost when every rank arrives together (the normal case): two store round trips per rank.
Without torch.distributed (a single process), or for a group of one rank, nothing is asked.

The store has no owner check (c10d's TCPStore takes any client that reaches its port), so what
is read back is checked: more arrivals than the group has, or a decision no rank writes (not
``go``, not ``abort:...``, or longer than a rank's), aborts the action on every rank with a line
saying the store was written by someone else. A forged ``go`` could start a collective on a
subset of the ranks: a hang made by the tool.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

#: Store keys live under this prefix (next to the ``probe_agent/rank{N}`` discovery entries).
STORE_PREFIX = "probe_actions"
_POLL_S = 0.005
#: The longest decision a rank writes ("abort:" and one line); a longer one is not a rank's.
MAX_DECISION = 400


class StepAgreement:
    """All-or-nothing agreement for one action at a time (called on the training thread)."""

    def __init__(self) -> None:
        self._store: Any = None
        self._lock = threading.Lock()

    @staticmethod
    def distributed() -> Any:
        """``torch.distributed`` if the program initialised it, else None (never imports it)."""
        dist = sys.modules.get("torch.distributed")
        if dist is None or not getattr(dist, "is_initialized", lambda: False)():
            return None
        return dist

    def group_size(self, group: list[int] | None) -> int:
        """How many ranks must arrive: the action's group, or the whole job."""
        if group is not None:
            return len(set(group))
        dist = self.distributed()
        return dist.get_world_size() if dist is not None else 1

    def store(self) -> Any:
        with self._lock:
            if self._store is None:
                dist = self.distributed()
                if dist is None:
                    return None
                from datetime import timedelta

                base = dist.distributed_c10d._get_default_store()
                base = getattr(base, "_underlying_non_prefix_store", None) or base
                try:
                    base = base.clone()  # our own connection: never share the trainer's socket
                except (AttributeError, RuntimeError):
                    pass
                base.set_timeout(timedelta(seconds=10))
                self._store = dist.PrefixStore(STORE_PREFIX, base)
            return self._store

    def agree(
        self,
        action_id: str,
        group: list[int] | None,
        timeout_s: float,
        cancelled: Callable[[], bool],
        step: int,
    ) -> tuple[bool, str]:
        """Block until the group's decision for ``action_id`` is known.

        Args:
            group: the ranks the CLI sent the action to; None means every rank of the job.
            timeout_s: after this, with ranks still missing, this rank votes abort.
            cancelled: polled while waiting; True (the CLI gave up) votes abort at once.

        Returns:
            (run, why): ``run`` is the decision every rank of the group reads; ``why`` says why
            it was aborted.
        """
        n = self.group_size(group)
        if n <= 1:
            return True, ""
        store = self.store()
        if store is None:
            return True, ""
        arrived = int(store.add(f"{action_id}/arrived", 1))
        deadline = time.monotonic() + timeout_s
        key = f"{action_id}/decision"
        while True:
            vote = None
            if arrived > n:
                vote = (f"abort:{arrived} arrivals counted for a group of {n} ranks: the job's "
                        "store was written by someone else")
            elif arrived == n:
                vote = "go"
            elif cancelled():
                vote = f"abort:cancelled while {arrived} of {n} ranks had reached step {step}"
            elif time.monotonic() > deadline:
                vote = (
                    f"abort:only {arrived} of {n} ranks reached step {step} within "
                    f"PROBE_ACTION_TIMEOUT_S={timeout_s:g} s"
                )
            elif store.check([key]):  # someone already decided (a late arrival after an abort)
                vote = "abort:decided elsewhere"
            if vote is not None:
                decision = store_text(store.compare_set(key, "", vote))
                if decision == "go":
                    return True, ""
                if not decision.startswith("abort:") or len(decision) > MAX_DECISION:
                    return False, ("skipped: the decision in the job's store was not written by "
                                   "a rank (another user of the store?)")
                why = decision.removeprefix("abort:")
                return False, f"skipped on every rank: {why}"
            time.sleep(_POLL_S)
            arrived = int(store.add(f"{action_id}/arrived", 0))


def store_text(value: Any) -> str:
    """A c10d store value as text (bytes from a TCPStore; at most MAX_DECISION + 1 read)."""
    if isinstance(value, str):
        return value
    return bytes(value[:MAX_DECISION + 1]).decode(errors="replace")
