"""`probe memory`: memory growth per step (leaks) and, with --modules, memory per module."""

from __future__ import annotations

import click

from ..diagnose.number_checks import MEMORY_WARMUP_STEPS, MEMORY_WINDOW_STEPS
from ..outcome import Outcome
from ..transport.session import Session
from . import pass_session
from ._canned import canned_outcome
from ._window import last_option


@click.command("memory")
@last_option(None, 2, "Look at the last N steps (default: 1000, the window `probe doctor` "
             "judges; with --modules: the last N traced steps, default 50).")
@click.option("--modules", "by_module", is_flag=True,
              help="CUDA memory per module (allocated when calls end, allocator peak) instead "
                   "of growth per step.")
@click.option("--limit", type=click.IntRange(min=1), default=15, show_default=True,
              help="With --modules: modules shown per rank.")
@click.option("--warmup", type=click.IntRange(min=0), default=MEMORY_WARMUP_STEPS,
              show_default=True,
              help="Leave out the first N steps each rank recorded (optimizer state and caches "
                   "grow there); the defaults show the numbers `probe doctor` judged.")
@pass_session
def command(session: Session, last: int | None, by_module: bool, limit: int,
            warmup: int) -> Outcome:
    """Memory growth per step on every rank and device, the job's and the agent's apart: the
    job's memory (CUDA allocated, or RSS minus the agent's share) with a robust growth per step
    (Theil-Sen; mem_mib_per_step, late_mib_per_step for the second half, rising_quarters), the
    raw RSS, the agent's own DuckDB MiB and threads, CUDA reserved, peak, alloc retries and
    OOMs. From python.memory (canned query memory_growth)."""
    if by_module:
        return canned_outcome(
            session, "memory_by_module",
            "no traced steps yet (`probe trace on` traces every step from the next one)",
            last=last or 50, limit=limit,
        )
    return canned_outcome(
        session, "memory_growth",
        "no optimizer step seen yet (python.memory gets one row per optimizer step)",
        last=last or MEMORY_WINDOW_STEPS, warmup=warmup,
    )
