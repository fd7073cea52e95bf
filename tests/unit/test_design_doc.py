"""The design decisions stay an architecture document: an index (docs/design-decisions.md) of one
file per part under docs/decisions/, in the order a reader meets them, the glossary first, each
short enough to read at a sitting, and no history (issue numbers, "revised", "corrections": git
keeps those)."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
INDEX = DOCS / "design-decisions.md"
PARTS_DIR = DOCS / "decisions"

PARTS = ["Glossary", "Agent", "Store", "Tracer", "Collectors", "Serving", "Watchdog",
         "Post-mortem", "Actions and jobs", "Frameworks", "CLI and transport",
         "Diagnosis (verdicts)", "Training numerics", "Throughput", "Dashboard and metrics",
         "Profiling", "Security", "Protocol", "Measurement method"]


def _linked_parts() -> list[tuple[str, Path]]:
    links = re.findall(r"^- \[(.+)\]\((decisions/[a-z0-9-]+\.md)\)$", INDEX.read_text(), re.M)
    return [(title, DOCS / path) for title, path in links]


def test_index_lists_the_parts_in_order_and_each_file_exists():
    linked = _linked_parts()
    assert [title for title, _ in linked] == PARTS
    for title, path in linked:
        assert path.is_file(), f"{title}: {path} is missing"
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert first == f"# Design decisions: {title}", path


def test_no_part_is_longer_than_a_sitting():
    for _, path in _linked_parts():
        n = len(path.read_text(encoding="utf-8").splitlines())
        assert n <= 900, f"{path.name} has {n} lines: split it along its sections"


def test_every_file_under_decisions_is_indexed():
    indexed = {path.name for _, path in _linked_parts()}
    assert {p.name for p in PARTS_DIR.glob("*.md")} == indexed


def test_headings_carry_no_history():
    for path in [INDEX, *PARTS_DIR.glob("*.md")]:
        headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
        old = [h for h in headings if re.search(r"issue \d|revised|correction", h, re.I)]
        assert not old, f"{path.name}: say what holds now (git keeps the history): {old}"


def test_the_glossary_defines_the_words_the_cli_uses():
    glossary = (PARTS_DIR / "glossary.md").read_text(encoding="utf-8")
    for word in ("**Step**", "**Micro-step**", "**Traced step**", "**Window**", "`--last N`",
                 "`--for N`"):
        assert word in glossary, word
