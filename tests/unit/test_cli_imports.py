"""Importing probe_cli, every module of it, pulls in neither probe_agent, torch nor duckdb
(DESIGN.md: the CLI installs on a laptop; the wire format is its only contract with the agent).

Checked in a fresh interpreter, so what this test process has imported does not count. A
control run imports probe_agent on purpose, so the check is shown to be able to fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("probe_agent", "torch", "duckdb")

SCRIPT = """
import importlib, json, pkgutil, sys
import probe_cli
names = ["probe_cli"]
for m in pkgutil.walk_packages(probe_cli.__path__, "probe_cli."):
    if m.name.endswith("__main__"):
        continue  # runs the CLI
    importlib.import_module(m.name)
    names.append(m.name)
for extra in sys.argv[1:]:
    importlib.import_module(extra)
forbidden = FORBIDDEN
loaded = sorted(n for n in sys.modules if n.split(".")[0] in forbidden)
print(json.dumps({"imported": names, "forbidden": loaded}))
""".replace("FORBIDDEN", repr(FORBIDDEN))


def _import_all(*extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE")}
    out = subprocess.run([sys.executable, "-c", SCRIPT, *extra], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_no_probe_cli_module_imports_the_agent_torch_or_duckdb():
    # WHEN every module of probe_cli is imported in a fresh interpreter
    got = _import_all()
    # THEN all of them were (the walk saw the subpackages), and none pulled in the agent's side
    assert {"probe_cli.main", "probe_cli.commands.query"} <= set(got["imported"]), got
    assert len(got["imported"]) > 40, got["imported"]
    assert got["forbidden"] == [], got["forbidden"]


@pytest.mark.parametrize("module", ["probe_agent"])
def test_the_check_sees_a_forbidden_import(module):
    assert module in _import_all(module)["forbidden"]
