"""docs/design-decisions.md stays an architecture document: organised by part, in the order a
reader meets them, with the glossary first, and no history (issue numbers, "revised",
"corrections": git keeps those)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "design-decisions.md"

PARTS = ["Glossary", "Agent", "Store", "Tracer", "Collectors", "Serving", "Watchdog",
         "Post-mortem", "Actions and jobs", "Frameworks", "CLI and transport",
         "Diagnosis (verdicts)", "Throughput", "Dashboard and metrics", "Profiling", "Security",
         "Protocol", "Measurement method"]


def test_parts_in_order_and_nothing_else_at_the_top_level():
    text = DOC.read_text(encoding="utf-8")
    assert re.findall(r"^## (.+)$", text, re.M) == PARTS


def test_headings_carry_no_history():
    headings = re.findall(r"^#+ (.+)$", DOC.read_text(encoding="utf-8"), re.M)
    old = [h for h in headings if re.search(r"issue \d|revised|correction", h, re.I)]
    assert not old, f"say what holds now, under its part (git keeps the history): {old}"


def test_the_glossary_defines_the_words_the_cli_uses():
    text = DOC.read_text(encoding="utf-8")
    glossary = text.split("\n## Glossary\n", 1)[1].split("\n## ", 1)[0]
    for word in ("**Step**", "**Micro-step**", "**Traced step**", "**Window**", "`--last N`",
                 "`--for N`"):
        assert word in glossary, word
