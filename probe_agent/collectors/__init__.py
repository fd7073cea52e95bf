"""Collectors feed the store. Each has ``start(sink)`` and ``stop()``, nothing else.

``Guard`` is the one sanctioned way for code that runs on the *training* thread (hooks) to fail:
the failure is counted, logged once, and after ``limit`` failures the collector switches itself
off. Training never sees the exception.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol


class Sink(Protocol):
    def append(self, table: str, data: Any) -> None: ...

    def add_flusher(self, fn: Any) -> None: ...

    def reader_waiting(self, table: str) -> bool: ...


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
