"""RareReader: a collector that reads something about the job rarely, on the training thread.

The schedule and the parallel layout are read by walking the heap (~100 ms, every thread waits)
and do not change while a job runs, so they are read at the first optimizer step the agent sees,
then at steps 10, 100, 1000, ... (ten times further each time), at most ``max_reads`` times.
On the training thread because what is read is the job's own state (a LambdaLR is probed by
calling the job's function, which must not race the step). The time it takes is the agent's
boundary work: ``python.steps.agent_ms``, not the job's step.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from . import Guard, Sink
from .row_buffer import RowBuffer

if TYPE_CHECKING:
    from ..clock import StepClock

#: Rows kept between flushes (a handful of reads per run).
BUFFER = 1000


class RareReader:
    """Subclasses set ``table`` and ``name`` and implement ``read(step, frame)``: the rows of
    one read (``frame`` is the training thread's, the caller of the step hook)."""

    table = ""
    name = ""
    max_reads: int | None = None

    def __init__(self, clock: StepClock, rank: int) -> None:
        self.clock = clock
        self.rank = rank
        self.guard = Guard(self.name)
        self.rows = RowBuffer(self.table, BUFFER)  # this reader's rows, flushed by the writer
        self._next = 0  # the next step at which it reads
        self._reads = 0
        self._unsubscribe: Any = None

    def start(self, sink: Sink) -> None:
        self.rows.start(sink)
        self._unsubscribe = self.clock.subscribe(self._on_step, self.name)
        sink.add_flusher(self.flush)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def read(self, step: int, frame: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    # -- training thread ---------------------------------------------------------------------
    def _on_step(self, step: int, optimizer: Any) -> None:
        if step < self._next or not self.guard.enabled:
            return
        if self.max_reads is not None and self._reads >= self.max_reads:
            return
        self._next = max(10, 10 * step)
        self._reads += 1
        try:
            self.rows.extend(self.read(step, sys._getframe(1))[: self.rows.room()])
        except Exception as e:  # noqa: BLE001 - training thread: counted, never raised
            self.guard.failed(e)

    # -- writer thread -----------------------------------------------------------------------
    def flush(self) -> None:
        self.rows.flush()
