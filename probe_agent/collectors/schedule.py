"""ScheduleWatcher: the job's LR schedule in optimizer steps -> ``python.schedule``.

At the first optimizer step the agent sees, then at steps 10, 100, 1000, ... (ten times further
each time), on the training thread, it finds the LR schedulers of the stepping optimizers
(the framework layer: the HF Trainer's LambdaLR, Lightning's configs, the script's own) and the
total the framework declares (HF ``max_steps``, Lightning ``max_steps`` or
``estimated_stepping_batches``), and records one row per top-level scheduler: where its warmup
and decay end (schedule_read.py: read from its settings, or measured from its lambda), and its
own step count beside the optimizer's (a per-epoch scheduler counts epochs, and its steps are
not optimizer steps).

Why so rarely: finding the schedulers walks the heap (discovery's gc scan, 50-100 ms on a large
job, reused while fresh), and a schedule does not change while it runs. Why on the training
thread: a LambdaLR is probed by calling the job's own function, which must not race the step.
`probe throughput` turns the steps into tokens with GB_tok and names the trap (a schedule that
ends before or after the job's own total, or a job already past its schedule's end).
"""

from __future__ import annotations

import time
from typing import Any

from .rare_reads import RareReader
from .registry import CollectorSpec
from .schedule_read import MAX_HORIZON, MIN_HORIZON, describe, job_total

TABLE = "python.schedule"


class ScheduleWatcher(RareReader):
    """Collector for python.schedule; the clock's optimizers are the ones whose schedulers
    count."""

    table = TABLE
    name = "schedule watcher"

    def read(self, step: int, frame: Any) -> list[tuple[Any, ...]]:
        """One row per top-level scheduler of the stepping optimizers (none: one row saying so,
        so that `probe throughput` can tell "no scheduler" from "not read yet")."""
        from ..frameworks import discover, unwrap

        stepping = self.clock.optimizers()
        d = discover(frame=frame, optimizers=stepping, frame_locals=False)
        total, source = job_total(d.framework, d.trainer)
        ids = {id(unwrap.optimizer(o)) for o in stepping}
        mine = [s for s in d.schedulers
                if id(unwrap.optimizer(getattr(s, "optimizer", None))) in ids]
        inside = {id(x) for s in mine for x in getattr(s, "_schedulers", ())}
        horizon = min(max(MIN_HORIZON, 4 * (total or 0), 4 * step), MAX_HORIZON)
        now = time.time()
        rows: list[tuple[Any, ...]] = []
        for s in mine:
            if id(s) in inside:
                continue  # described as part of its SequentialLR/ChainedScheduler
            r = describe(s, horizon)
            last = getattr(s, "last_epoch", None)
            rows.append((now, self.rank, step, r["scheduler"], d.name_of(s), r["kind"],
                         r["method"], r["warmup_steps"], r["end_step"], r["after_end"],
                         last if isinstance(last, int) else None, total, source, d.framework,
                         r["note"]))
        if not rows:
            rows.append((now, self.rank, step, None, None, "none", None, None, None, None, None,
                         total, source, d.framework, "no LR scheduler steps these optimizers"))
        return rows


#: This collector, for the registry (registry.py).
COLLECTOR = CollectorSpec("schedule", 70, lambda b: ScheduleWatcher(b.clock, b.rank),
                          tables=("python.schedule",))
