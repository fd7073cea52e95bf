"""Every dotted ``probe_agent.…`` / ``probe_cli.…`` name the docs tell users to call exists
(design-decisions named ``probe_agent.checkpoint.load``, which did not), and `eval --help`
says what an eval without a step flag does."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAME = re.compile(r"\b(probe_(?:agent|cli)(?:\.[A-Za-z_]\w*)+)")


def _names() -> list[str]:
    found = set()
    for doc in DOCS:
        found.update(m.rstrip(".") for m in NAME.findall(doc.read_text()))
    return sorted(found)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("dotted", _names())
def test_a_name_the_docs_give_exists(dotted):
    pytest.importorskip("duckdb")
    assert _resolves(dotted), f"{dotted} is named in the docs but does not exist"


def test_eval_help_says_an_eval_without_a_step_flag_runs_at_once():
    from probe_cli.main import cli

    out = CliRunner().invoke(cli, ["eval", "--help"]).output
    assert "runs at once" in out and "Default: the next step" not in out, out
