"""The kernel's CPU-list form (``0-3,8``), as ``taskset -c`` and ``Cpus_allowed_list`` write it:
how the agent stores a thread's CPU affinity (``python.steps.cpu_affinity``) and how the CLI
reads it back (the straggler verdict compares the ranks' CPUs)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: A range wider than this is not a CPU list the agent wrote.
_MAX_SPAN = 1 << 16


def cpu_list(cpus: Iterable[int]) -> str:
    """``{0, 1, 2, 3, 8}`` -> ``"0-3,8"``."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def parse_cpu_list(text: Any) -> frozenset[int] | None:
    """``"0-3,8"`` -> ``{0, 1, 2, 3, 8}``; None when absent or not a CPU list."""
    if not isinstance(text, str) or not text.strip():
        return None
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            a, b = int(lo), int(hi or lo)
            if a < 0 or b < a or b - a > _MAX_SPAN:
                return None
            cpus.update(range(a, b + 1))
    except ValueError:
        return None
    return frozenset(cpus)
