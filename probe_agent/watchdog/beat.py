"""The heartbeat file: 40 bytes the agent rewrites every ``INTERVAL_S`` (stdlib only).

Layout (little endian): ``seq, monotonic_ns, step, busy_until_ns, seq``. The sequence number is
written at both ends, so a reader that sees two different values read a half-written record and
retries. CLOCK_MONOTONIC is system-wide, so the watchdog compares ``monotonic_ns`` with its own
clock. ``step`` is -1 until the rank has finished an optimizer step. ``busy_until_ns`` (0: not
busy): the agent holds the GIL on purpose until then (a heap walk, heapscan.py), so a request
that waits meanwhile should wait for its answer, not get a 504 "GIL held".
"""

from __future__ import annotations

import os
import struct
import time

RECORD = struct.Struct("<QqqqQ")
INTERVAL_S = 0.25


def write(fd: int, seq: int, step: int | None, busy_until_ns: int = 0) -> None:
    os.pwrite(fd, RECORD.pack(seq, time.monotonic_ns(), -1 if step is None else step,
                              busy_until_ns, seq), 0)


def read(path: str) -> tuple[float, int | None, float] | None:
    """(age in seconds, last step or None, seconds the agent said it stays busy on purpose,
    0 when not), or None when there is no readable record."""
    for _ in range(3):
        try:
            with open(path, "rb") as f:
                data = f.read(RECORD.size)
        except OSError:
            return None
        if len(data) != RECORD.size:
            return None
        seq1, mono_ns, step, busy_until_ns, seq2 = RECORD.unpack(data)
        if seq1 == seq2:
            now = time.monotonic_ns()
            age = max(0.0, (now - mono_ns) / 1e9)
            busy = max(0.0, (busy_until_ns - now) / 1e9) if busy_until_ns else 0.0
            return age, (None if step < 0 else step), busy
    return None
