"""HistoryWindow: the CUDA allocator's history over the next N steps, as the pickle that
pytorch.org/memory_viz opens (`probe memory --snapshot --for N -o snap.pickle`).

``torch.cuda.memory._record_memory_history(max_entries=...)`` starts recording every alloc and
free with its stack; after N step boundaries ``memory._snapshot()`` takes the segments, their
blocks and the trace, and recording stops (``enabled=None``). While it records, an OOM's record
(oom.py) also writes the snapshot. Recording costs ~2 us per allocation (torch's docs), so it is
bounded by the window and by ``MAX_ENTRIES``. CUDA only: with no CUDA context it refuses.
"""

from __future__ import annotations

import pickle
import sys
import threading
from typing import Any

#: alloc/free events kept (a ring: the last ones), a few KB each.
MAX_ENTRIES = 100_000


class NoCudaError(RuntimeError):
    """The job has not initialised CUDA: there is no allocator history to record."""


class HistoryWindow:
    """Args:
        stepclock: the step boundaries that count the window.
        oom: the OOM recorder, told while the history records (its snapshot goes beside the
            record).
    """

    def __init__(self, stepclock: Any, oom: Any) -> None:
        self.stepclock = stepclock
        self.oom = oom
        self._lock = threading.Lock()  # one window at a time

    def record(self, steps: int, timeout: float) -> tuple[bytes, int, int]:
        """Record ``steps`` steps (waiting at most ``timeout`` s); returns the pickle, the first
        and the last step of the window."""
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_initialized():
            raise NoCudaError("this rank has not initialised CUDA: no allocator to record")
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("a snapshot window is already recording on this rank")
        done = threading.Event()
        seen = []

        def on_step(step: int, optimizer: Any) -> None:
            seen.append(step)
            if len(seen) >= steps:
                done.set()

        unsubscribe = self.stepclock.subscribe(on_step, "allocator history")
        first = self.stepclock.current_step + 1
        try:
            cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
            if self.oom is not None:
                self.oom.recording_history = True
            done.wait(timeout)
            snap = cuda.memory._snapshot()
            return pickle.dumps(snap), first, seen[-1] if seen else first - 1
        finally:
            unsubscribe()
            if self.oom is not None:
                self.oom.recording_history = False
            cuda.memory._record_memory_history(enabled=None)
            self._lock.release()
