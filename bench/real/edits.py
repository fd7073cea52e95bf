"""The one way the real-script adapters change an upstream file: each (old, new) edit must
match exactly once, or the upstream changed and the adapter says which edit no longer fits."""

from __future__ import annotations


def apply(src: str, edits: list[tuple[str, str]]) -> str:
    for old, new in edits:
        if src.count(old) != 1:
            raise SystemExit(f"upstream changed: {old!r} found {src.count(old)} times")
        src = src.replace(old, new)
    return src


def adapt_file(upstream: str, dest: str, edits: list[tuple[str, str]]) -> None:
    """Write ``upstream`` with ``edits`` applied (``apply``) to ``dest`` (may be the same)."""
    with open(upstream) as f:
        text = apply(f.read(), edits)
    with open(dest, "w") as f:
        f.write(text)
