"""A profile window's memory: what it may grow the process by, and giving it back afterwards.

torch.profiler keeps every event in memory until it stops, and more with ``record_shapes`` and
``with_stack``: ``profile --steps 500 --record-shapes --with-stack`` took a rank's RSS from 425
to 1122 MiB, and (measured here) 415 to 2254 MiB over 300 steps. So:

- a window's budget is the RSS it may add (``max_mb``), the export included. Most of it comes
  at the stop, when torch turns its events into Python objects and JSON (30 steps: +11 MiB
  while recording, +158 MiB at the export's peak), so the RSS read at every step boundary of
  the window (one ``/proc/self/statm`` read, ~2 µs) is projected by window.py's
  ``EXPORT_FACTOR``; a window whose projection passes the budget ends at that boundary, with
  ``stopped_by`` saying why (the trace then covers fewer steps, as with the time ceiling);
- after the export the profiler's events are dropped, collected (they sit in reference
  cycles) and glibc is asked to return its free heap to the system (``malloc_trim``): without
  that the window's peak became the rank's new floor.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_mib() -> float | None:
    """This process's resident set size in MiB (None where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE / (1 << 20)
    except (OSError, ValueError, IndexError):
        return None


def _trim() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _trim()


def give_back() -> None:
    """Return malloc's free heap to the system (glibc; elsewhere a no-op)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
