"""Packages named for what they hold: diagnose/ computes verdicts and render/ formats text;
neither talks to an agent (gather/ and transport/ do) nor builds files for other tools
(export/ does). Checked in a fresh interpreter, so what this process imported does not count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import importlib, json, pkgutil, sys
pkg = importlib.import_module(sys.argv[1])
for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
    importlib.import_module(m.name)
for extra in sys.argv[2:]:
    importlib.import_module(extra)
print(json.dumps(sorted(sys.modules)))
"""

#: Talking to agents, or the packages that do.
NETWORK = ("httpx", "http.client", "probe_cli.transport.client", "probe_cli.transport.fanout",
           "probe_cli.transport.session", "probe_cli.gather")


def _loaded(package: str, *extra: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, package, *extra], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout))


def _hits(loaded: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.mark.parametrize("package", ["probe_cli.diagnose", "probe_cli.render"])
def test_verdicts_and_text_make_no_network_call(package):
    # WHEN every module of the package is imported
    loaded = _loaded(package)
    # THEN no networking module came with it, and no export (files are export/'s)
    assert _hits(loaded, NETWORK) == []
    assert _hits(loaded, ("probe_cli.export",)) == []


def test_the_check_sees_a_network_import():
    """Control: gather/ asks the ranks, so importing it alongside must be seen."""
    assert "probe_cli.gather" in _hits(_loaded("probe_cli.diagnose", "probe_cli.gather"), NETWORK)
