"""`probe info`'s second part: what the agent changed in each training process (the patch
ledger, probe_agent/patches.py, as ``/v1/info`` sends it). Ranks that report the same changes
are shown once, under their rank label. Pure: lines out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from probe_protocol.bodies import InfoBody

from ..group import group_by, rank_label
from ..result import RankResult
from .text import paint


def _patch_line(p: dict[str, Any]) -> str:
    line = f"  {p.get('target')}  [{p.get('by')}] {p.get('why')}"
    if not p.get("restorable", True):
        line += f"; kept for the process: {p.get('why_kept')}"
    if p.get("note"):
        line += f" ({p['note']})"
    return line


def _setting_line(s: dict[str, Any]) -> str:
    what = f"{s.get('name')}: {s.get('value')}"
    if s.get("temporary"):
        what += f" (for a moment, {s.get('uses', 0)} times so far)"
    line = f"  {what}  [{s.get('by')}] {s.get('why')}"
    if not s.get("restorable", True):
        line += f"; kept for the process: {s.get('why_kept')}"
    return line


def _key(r: RankResult) -> tuple[tuple[str, ...], tuple[str, ...]]:
    info = InfoBody.from_wire(r.data)
    return (tuple(_patch_line(p) for p in info.patches),
            tuple(_setting_line(s) for s in info.settings if not s.get("temporary")))


def patch_lines(results: Sequence[RankResult], colour: bool = False) -> list[str]:
    """What probe replaced and set in each process, ranks with the same changes together;
    nothing when no rank reports any (an agent older than the ledger)."""
    out: list[str] = []
    for g in group_by([r for r in results if r.ok], _key):
        info = InfoBody.from_wire(g.first.data)
        if not info.patches and not info.settings:
            continue
        label = rank_label([m.rank for m in g.members])
        out += ["", paint(f"What probe changed in the process ({label}):", "bold", colour)]
        out += [_patch_line(p) for p in info.patches] or ["  (no attribute replaced)"]
        if info.settings:
            out.append(paint("Process-wide settings:", "bold", colour))
            out += [_setting_line(s) for s in info.settings]
    return out
