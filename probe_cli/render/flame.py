"""`probe flame`'s tables as text: the widest frames, the hottest frames and the rank
differences that export/flame.py's ``flame_tables`` computed. Pure; nothing here prints."""

from __future__ import annotations

from typing import Any

from .text import format_table


def render_flame(tables: dict[str, Any], colour: bool = False) -> list[str]:
    ranks = tables["ranks"]
    out = ["widest frames (% of each rank's samples with the frame on the stack)"]
    rows = [[w["frame"], f"{w['median_pct']:.1f}", f"{w['self_pct']:.1f}",
             *(f"{w['ranks'].get(r, 0.0):.1f}" for r in ranks)] for w in tables["widest"]]
    out += format_table(["frame", "median%", "self%", *(f"rank {r}%" for r in ranks)], rows,
                        colour=colour)
    hot = [[h["frame"], f"{h['self_pct']:.1f}", *(f"{h['ranks'].get(r, 0.0):.1f}" for r in ranks)]
           for h in tables["hottest"]]
    out += ["", "hottest frames (self time: the frame itself was running)"]
    out += format_table(["frame", "median self%", *(f"rank {r}%" for r in ranks)], hot,
                        colour=colour)
    diffs = tables["differences"]
    out.append("")
    if diffs:
        out.append("rank differences (one rank far above the median of the ranks)")
        out += format_table(["rank", "frame", "rank%", "median%"],
                            [[d["rank"], d["frame"], f"{d['pct']:.1f}",
                              f"{d['median_pct']:.1f}"] for d in diffs], colour=colour)
    elif len(ranks) > 1:
        out.append(f"rank differences: none (no frame {tables['diff_points']:g} points and "
                   f"{tables['diff_ratio']:g}x above the median on any rank)")
    return out
