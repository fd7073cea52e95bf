"""`probe memory`: memory growth per step (leaks) and, with --modules, memory per module."""

from __future__ import annotations

import click

from ..outcome import Outcome
from ..transport.session import Session
from . import pass_session
from ._canned import canned_outcome


@click.command("memory")
@click.option("--steps", type=click.IntRange(min=2), default=50, show_default=True,
              help="Look at the last K steps (with --modules: the last K traced steps).")
@click.option("--modules", "by_module", is_flag=True,
              help="CUDA memory per module (allocated when calls end, allocator peak) instead "
                   "of growth per step.")
@click.option("--limit", type=click.IntRange(min=1), default=15, show_default=True,
              help="With --modules: modules shown per rank.")
@click.option("--warmup", type=click.IntRange(min=0), default=0, show_default=True,
              help="Leave out the first N steps each rank recorded (optimizer state and caches "
                   "grow there). `probe doctor` leaves out 10: --warmup 10 --steps 50 shows "
                   "the numbers its memory check judged.")
@pass_session
def command(session: Session, steps: int, by_module: bool, limit: int, warmup: int) -> Outcome:
    """Memory growth per step on every rank and device: RSS, and CUDA allocated/reserved, with
    the growth per step (a steady positive rss_mib_per_step or allocated_mib_per_step is a
    leak), peak, alloc retries and OOMs. From python.memory (canned query memory_growth)."""
    if by_module:
        return canned_outcome(
            session, "memory_by_module",
            "no traced steps yet (`probe trace on` traces every step from the next one)",
            steps=steps, limit=limit,
        )
    return canned_outcome(
        session, "memory_growth",
        "no optimizer step seen yet (python.memory gets one row per optimizer step)",
        steps=steps, warmup=warmup,
    )
