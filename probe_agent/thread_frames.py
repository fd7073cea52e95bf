"""``current_frames()``: ``sys._current_frames()`` without CPython 3.11's deadlock.

On 3.11 and older, ``sys._current_frames()`` holds the runtime's HEAD_LOCK while it creates
frame objects; an allocation there can start a garbage collection, and a collected
``threading.local`` takes HEAD_LOCK again: the process hangs for good, every thread with it
(CPython gh-106883; the 3.11 backport, PR #117332, was not merged). Seen here: an eval's thread
stuck in ``sys._current_frames()`` and every other thread waiting to start one, in 4 of 9 runs
of the integration tests on a loaded machine. The agent reads frames from several threads (the
sampler 100 times a second), so each read runs with the collector off; 3.12 collects only
between bytecodes and needs none of this.
"""

from __future__ import annotations

import gc
import sys
import threading
from types import FrameType

from . import patches

_lock = threading.Lock()  # gc.disable/enable is process-wide: one read at a time flips it
_SAFE = sys.version_info >= (3, 12)
#: In the patch ledger (patches.py): `probe info` shows how many reads turned the collector off.
_WINDOW = None if _SAFE else patches.window(
    "gc.disable()", "around each sys._current_frames()", by="stack reads",
    why="CPython gh-106883: a collection inside sys._current_frames() hangs 3.11")


def current_frames() -> dict[int, FrameType]:
    """Every thread's current frame, by thread id (``sys._current_frames()``)."""
    if _SAFE:
        return sys._current_frames()
    with _lock:
        _WINDOW.uses += 1  # type: ignore[union-attr]
        was = gc.isenabled()
        gc.disable()
        try:
            return sys._current_frames()
        finally:
            if was:
                gc.enable()
