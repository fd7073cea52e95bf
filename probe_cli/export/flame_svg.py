"""A self-contained flame graph: SVG, and an HTML page around it. Stdlib only.

The classic layout (flamegraph.pl): the root at the bottom, children above their parent, widths
proportional to samples, siblings sorted by name. Each box carries a ``<title>`` tooltip (frame,
samples, percent). Boxes narrower than MIN_PX are left out (they could not be read anyway), which
also bounds the file size. The HTML page embeds the SVG and the tables as text: no script, no
external resource, so a dashboard can link or iframe it as is.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from html import escape
from typing import Any

WIDTH = 1200
ROW = 16
MIN_PX = 0.5
FONT = 11


def _tree(folded: Mapping[str, int]) -> dict[str, Any]:
    root: dict[str, Any] = {"n": 0, "kids": {}}
    for stack, n in folded.items():
        node = root
        node["n"] += n
        for label in stack.split(";"):
            node = node["kids"].setdefault(label, {"n": 0, "kids": {}})
            node["n"] += n
    return root


def _depth(node: dict[str, Any]) -> int:
    return 1 + max((_depth(k) for k in node["kids"].values()), default=0)


def _colour(label: str) -> str:
    h = zlib.crc32(label.encode())  # stable per frame name, like flamegraph.pl's hash palette
    return f"rgb({205 + h % 50},{(h >> 8) % 180 + 40},{(h >> 16) % 55})"


def to_svg(folded: Mapping[str, int], title: str) -> str:
    root = _tree(folded)
    total = root["n"] or 1
    depth = _depth(root)
    height = (depth + 2) * ROW + 10
    scale = WIDTH / total
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'font-family="monospace" font-size="{FONT}">',
           f'<text x="{WIDTH / 2}" y="{ROW}" text-anchor="middle">{escape(title)}</text>']

    def draw(label: str, node: dict[str, Any], x: float, level: int) -> None:
        w = node["n"] * scale
        if w < MIN_PX:
            return
        y = height - (level + 1) * ROW
        pct = 100.0 * node["n"] / total
        text = escape(label)
        chars = int((w - 4) / (FONT * 0.6))
        shown = text if len(label) <= chars else (escape(label[: max(chars - 2, 0)]) + ".."
                                                  if chars > 3 else "")
        out.append(f'<g><title>{text} ({node["n"]} samples, {pct:.2f}%)</title>'
                   f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW - 1}" '
                   f'fill="{_colour(label)}" rx="2"/>'
                   f'<text x="{x + 2:.2f}" y="{y + ROW - 4}">{shown}</text></g>')
        cx = x
        for kid_label in sorted(node["kids"]):
            kid = node["kids"][kid_label]
            draw(kid_label, kid, cx, level + 1)
            cx += kid["n"] * scale

    draw("all", root, 0.0, 0)
    out.append("</svg>")
    return "\n".join(out)


def to_html(svg: str, title: str, tables: list[str]) -> str:
    """The SVG and the text tables in one page (no scripts, nothing fetched)."""
    body = escape("\n".join(tables))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:16px}pre{font-size:12px}</style></head>"
            f"<body><h2>{escape(title)}</h2>{svg}<pre>{body}</pre></body></html>\n")
