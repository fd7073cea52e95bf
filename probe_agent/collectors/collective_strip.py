"""The collectives' black box: the last explicit collectives of this rank in a small file mapped
into memory (``collectives.strip`` in the rank's post-mortem directory), so they outlive a rank
the backend aborts.

Why: gloo aborts a rank whose collective receives a size it did not expect (``EnforceNotMet``,
then SIGABRT from a gloo thread), and NCCL's async error handling does the same. Nothing runs in
the rank after that, and its last table copy is up to PROBE_POSTMORTEM_EVERY_S old: the call
that caused it (one scalar ``all_reduce`` at a line of the script) was in no copy. The wrapper
(collectives.py) writes each call into the map when it starts and again when it ends; the
kernel keeps a shared file mapping's pages after the process dies, so the dead rank's copy holds
its call, pending, with its seq, sizes and call site.

Layout (read by probe_protocol.postmortem.read_strip): ``SLOTS`` slots of ``SLOT`` bytes, each a
compact JSON list (``FIELDS``) padded with NUL; record ``n`` goes to slot ``n % SLOTS``. A slot
torn by a death mid-write fails to parse and is skipped. Cost: one ``json.dumps`` and a 512-byte
copy per start and end of an explicit collective (measured in bench/bench_collective_costs.py).
"""

from __future__ import annotations

import json
import mmap
import os
from typing import Any

from probe_protocol.postmortem import STRIP_FIELDS, STRIP_SLOT, STRIP_SLOTS


class CollectiveStrip:
    """A writable strip at ``path`` (created 0600, ``STRIP_SLOTS`` x ``STRIP_SLOT`` bytes)."""

    def __init__(self, path: str) -> None:
        size = STRIP_SLOTS * STRIP_SLOT
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.path = path

    def put(self, n: int, values: list[Any]) -> None:
        """Write record number ``n`` (values in ``STRIP_FIELDS`` order) into its slot."""
        data = json.dumps(values, separators=(",", ":"), default=str).encode()
        if len(data) >= STRIP_SLOT:  # a long call site: drop the shapes rather than tear JSON
            values = [*values]
            values[STRIP_FIELDS.index("shapes")] = "[]"
            data = json.dumps(values, separators=(",", ":"), default=str).encode()[
                :STRIP_SLOT - 1]
        off = (n % STRIP_SLOTS) * STRIP_SLOT
        self._map[off:off + STRIP_SLOT] = data.ljust(STRIP_SLOT, b"\0")

    def close(self) -> None:
        try:
            self._map.close()
        except (BufferError, ValueError):
            pass
