"""Collectors feed the store. Each has ``start(sink)`` and ``stop()``, nothing else; each is
built from what it uses (the step clock, the rank, the config), not from the Agent
(registry.py wires them).

``Sink`` is everything a collector may ask of the store; the Store (store/store.py) is the
only sink.

``Guard`` is the one sanctioned way for code that runs on the *training* thread (hooks) to fail:
the failure is counted, logged once, and after ``limit`` failures the collector switches itself
off. Training never sees the exception.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pyarrow as pa


class Sink(Protocol):
    def arrow_schema(self, table: str) -> pa.Schema:
        """``table``'s columns as schema.sql declares them: build every batch with it."""

    def append(self, table: str, data: pa.Table | pa.RecordBatch) -> None:
        """Queue a batch for ``table``; never blocks, never raises."""

    def add_flusher(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the writer thread every PROBE_FLUSH_MS and before every read."""

    def add_ticker(self, fn: Callable[[], object]) -> None:
        """Call ``fn`` on the writer thread now and then (housekeeping; no appends)."""

    def add_materializer(self, table: str, fn: Callable[[], pa.Table]) -> None:
        """Replace ``table``'s rows with ``fn()`` before any query that names it."""

    def reader_waiting(self, table: str) -> bool:
        """Whether a query naming ``table`` waits for the next flush."""

    def memory_bytes(self) -> float:
        """DuckDB's own memory (tables, buffers), for the agent's footprint columns."""


class Collector(Protocol):
    def start(self, sink: Sink) -> None: ...

    def stop(self) -> None: ...


class Guard:
    """Failure accounting for one collector.

    Args:
        name: shown in the single warning, e.g. ``"module tracer"``.
        limit: after this many failures ``enabled`` turns False and stays False, so a broken
            hook costs one attribute read per call from then on.
    """

    def __init__(self, name: str, limit: int = 10) -> None:
        self.name = name
        self.limit = limit
        self.failures = 0
        self.enabled = True
        self.last_error: str | None = None
        self._log = logging.getLogger(__name__)

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.failures == 1:
            self._log.warning(
                "probe agent: %s failed (%s); training continues, further failures are counted",
                self.name,
                self.last_error,
            )
        if self.failures >= self.limit and self.enabled:
            self.enabled = False
            self._log.warning(
                "probe agent: %s switched off after %d failures", self.name, self.failures
            )
