"""`probe memory`'s breakdown per rank as text lines (pure; diagnose/memory_use.py computes)."""

from __future__ import annotations

from ..diagnose.memory_use import Breakdown, levers, mib


def render_breakdown(b: Breakdown, world: int, advice: bool) -> list[str]:
    """One rank: the kinds with their shares, the total against the device, the top modules by
    saved activations and, with ``advice``, the levers ranked by bytes saved."""
    parts = b.kinds_text(shares=True)
    cap = ""
    if b.capacity:
        cap = (f" of {mib(float(b.capacity))} ({100 * (b.pressure or 0):.0f}% at the peak; "
               f"allocated {mib(float(b.allocated or 0))}, reserved {mib(float(b.reserved or 0))})")
    lines = [f"rank {b.rank} {b.device} (traced step {b.step}): total {mib(b.total)}{cap}",
             f"  {parts}"]
    if not b.counted_activations:
        lines.append(f"  activations: {b.uncounted}")
    elif b.top:
        tops = ", ".join(f"{t['module']} {mib(float(t['saved_mib'] or 0))} "
                         f"({100 * float(t['share'] or 0):.0f}%)" for t in b.top)
        lines.append(f"  top activations (own saved, share): {tops}")
    if advice:
        lv = levers(b, world)
        if not lv:
            lines.append("  advice: no lever frees memory here")
        for i, x in enumerate(lv, 1):
            lines.append(f"  {i}. {x.lever}: saves ~{mib(x.saves_mib)}: {x.action}")
            lines.append(f"     basis: {x.basis}")
    return lines
