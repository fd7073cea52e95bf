"""free_heap_mib(): the bytes glibc's malloc holds free, which RSS counts but nobody uses.

Why: a healthy 2-rank job polled by `probe doctor` every 12 s grew 536 -> 602 MiB of RSS
over 2600 steps, and a rank was once named for MEMORY GROWTH. ``mallinfo2`` showed whose it
was: the bytes in use stayed at 149-158 MiB while the allocator's arenas grew 204 -> 265 MiB
and their free chunks 52 -> 120 MiB (freed memory kept by the allocator: fragmentation from
the agent's queries and the job's own churn). A leak is memory in use; so the job's memory on
CPU is RSS minus the agent's own minus these free bytes (sql/queries/memory_growth.sql).
Python's small objects live in pymalloc arenas outside malloc, so they stay in RSS and a
leak of them is still seen.

Cost: ``mallinfo2`` walks every arena's free lists under that arena's lock: 1-2 ms here (once
8 ms), on the writer thread every ``AGENT_SAMPLE_S`` (steps.py), never on the training thread.
Without glibc >= 2.33 (musl, macOS) it returns None and nothing is subtracted.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

_MIB = 1.0 / (1 << 20)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _load() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    fn.argtypes = []
    return fn


_MALLINFO2 = _load()


def free_heap_mib() -> float | None:
    """Free bytes in malloc's arenas (``fordblks``: free chunks, the top chunk included), MiB."""
    if _MALLINFO2 is None:
        return None
    return _MALLINFO2().fordblks * _MIB
