"""The heartbeat file: 32 bytes the agent rewrites every ``INTERVAL_S`` (stdlib only).

Layout (little endian): ``seq, monotonic_ns, step, seq``. The sequence number is written at both
ends, so a reader that sees two different values read a half-written record and retries.
CLOCK_MONOTONIC is system-wide, so the watchdog compares ``monotonic_ns`` with its own clock.
``step`` is -1 until the rank has finished an optimizer step.
"""

from __future__ import annotations

import os
import struct
import time

RECORD = struct.Struct("<QqqQ")
INTERVAL_S = 0.25


def write(fd: int, seq: int, step: int | None) -> None:
    os.pwrite(fd, RECORD.pack(seq, time.monotonic_ns(), -1 if step is None else step, seq), 0)


def read(path: str) -> tuple[float, int | None] | None:
    """(age in seconds, last step or None), or None when there is no readable record."""
    for _ in range(3):
        try:
            with open(path, "rb") as f:
                data = f.read(RECORD.size)
        except OSError:
            return None
        if len(data) != RECORD.size:
            return None
        seq1, mono_ns, step, seq2 = RECORD.unpack(data)
        if seq1 == seq2:
            age = max(0.0, (time.monotonic_ns() - mono_ns) / 1e9)
            return age, (None if step < 0 else step)
    return None
