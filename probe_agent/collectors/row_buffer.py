"""RowBuffer: the rows of one table that a collector gathers and the writer thread appends.

Most small collectors gather plain tuples (in the table's column order) on the training thread
or in their own hooks, and hand them to the store on the writer's flush. This is that buffer,
declared once per collector with its table: ``start`` takes the table's Arrow schema from the
sink, ``flush`` moves what is buffered into the store. Lock-free, as the tracer's buffers are:
the producer only appends, and ``flush`` takes the first ``n`` rows with single list operations
under the GIL, so a row appended meanwhile waits for the next flush.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from . import Sink


class RowBuffer:
    """Rows of ``table`` (tuples in its column order) waiting for the writer's flush.

    Args:
        table: the store table the rows go to (``python.…``).
        cap: how many rows the collector keeps between flushes (``room``, ``full``); each
            collector decides where it checks, so a step's rows stay together.
    """

    def __init__(self, table: str, cap: int = 1000) -> None:
        self.table = table
        self.cap = cap
        self.rows: list[tuple[Any, ...]] = []
        self.sink: Sink | None = None
        self._schema: pa.Schema | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def start(self, sink: Sink) -> None:
        self.sink, self._schema = sink, sink.arrow_schema(self.table)

    def room(self) -> int:
        """How many rows fit before ``cap``."""
        return max(0, self.cap - len(self.rows))

    def full(self) -> bool:
        return len(self.rows) >= self.cap

    def add(self, row: tuple[Any, ...]) -> None:
        self.rows.append(row)

    def extend(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows.extend(rows)

    def flush(self) -> None:
        """Append every buffered row to the store (writer thread); nothing before ``start``."""
        n = len(self.rows)
        if not n or self.sink is None:
            return
        rows, self.rows[:n] = self.rows[:n], []
        self.sink.append(self.table, pa.table(list(map(list, zip(*rows))), schema=self._schema))
