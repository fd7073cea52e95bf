"""The docs people read stay whole: README is the front page (what probe is, a real session,
install, the two set-up commands, the command table, links) and every reference page it sends
readers to exists and is linked; every benchmark script is on the benchmarks page; every
document the code and docs cite exists (they cited a design file kept outside the repository);
open bugs live in docs/known-issues.md, not among the design decisions."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
#: The pages the README's settings, security, benchmark and fault-suite sections became.
PAGES = ("settings.md", "security.md", "benchmarks.md", "fault-suite.md", "frameworks.md",
         "troubleshooting.md", "http-api.md", "known-issues.md", "design-decisions.md",
         "gpu-check.md")
CITED = re.compile(r"\b((?:docs|docker)/[\w./-]+\.md)\b")
#: Where citations are looked for: everything a reader or a maintainer opens.
SOURCES = ("probe_agent", "probe_cli", "probe_protocol", "tests", "bench", "docs", "docker",
           "sql", "examples")


def _texts() -> list[tuple[Path, str]]:
    files = [ROOT / "README.md"]
    for top in SOURCES:
        files += [p for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".md", ".sql", ".sh")]
    return [(p, p.read_text(encoding="utf-8")) for p in files if "__pycache__" not in p.parts]


def test_the_readme_keeps_the_two_setup_commands_exactly():
    assert "bash docker/demo.sh" in README and "bash docker/test.sh" in README
    assert (ROOT / "docker" / "demo.sh").is_file() and (ROOT / "docker" / "test.sh").is_file()


def test_the_readme_links_every_reference_page_and_each_exists():
    for page in PAGES:
        assert (DOCS / page).is_file(), page
        assert f"(docs/{page})" in README, f"README does not link docs/{page}"


def test_the_readme_front_page_shows_a_session_before_the_reference():
    """A newcomer sees probe answering before any table: the session comes first."""
    session = README.index("## What it looks like")
    assert session < README.index("## Install") < README.index("## Commands")
    block = README[session:README.index("## Install")]
    assert "$ probe -t" in block and "no hang" in block


def test_every_cited_document_exists():
    missing = []
    for path, text in _texts():
        if "DESIGN" + ".md" in text:  # (spelt apart: this file would cite it)
            missing.append(f"{path.relative_to(ROOT)} cites a design file not in the repo")
        for cited in CITED.findall(text):
            if not (ROOT / cited).is_file():
                missing.append(f"{path.relative_to(ROOT)} cites {cited}")
    assert missing == []


def test_every_benchmark_script_is_on_the_benchmarks_page():
    page = (DOCS / "benchmarks.md").read_text()
    scripts = [p.name for p in (ROOT / "bench").glob("*.py")
               if "__main__" in p.read_text(encoding="utf-8")]
    assert "verdicts.py" in scripts  # the scan sees the entry points
    assert [s for s in scripts if s not in page] == []


def test_open_bugs_are_not_design_decisions():
    for path in (DOCS / "decisions").glob("*.md"):
        headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
        assert not [h for h in headings if re.match(r"open\b", h, re.I)], (
            f"{path.name}: an open bug goes to docs/known-issues.md")
