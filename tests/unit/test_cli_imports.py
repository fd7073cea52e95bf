"""Importing probe_cli, every module of it, pulls in neither probe_agent, torch nor duckdb
(docs/decisions/protocol.md: the CLI installs on a laptop; the protocol package is its only
contract with the agent). Importing probe_protocol, every module of it, pulls in nothing but the
standard library: the watchdog runs it under ``python -I -S`` and the CLI beside it.

Checked in a fresh interpreter, so what this test process has imported does not count. A
control run imports probe_agent on purpose, so each check is shown to be able to fail.
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
modules = sorted({n.split(".")[0] for n in sys.modules})
print(json.dumps({"imported": names, "forbidden": loaded, "modules": modules}))
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
    assert "probe_protocol" in got["modules"]  # the CLI reads every body through it


@pytest.mark.parametrize("module", ["probe_agent"])
def test_the_check_sees_a_forbidden_import(module):
    assert module in _import_all(module)["forbidden"]


PROTOCOL_SCRIPT = """
import importlib, json, pkgutil, sys
before = set(sys.modules)
import probe_protocol
names = ["probe_protocol"]
for m in pkgutil.walk_packages(probe_protocol.__path__, "probe_protocol."):
    importlib.import_module(m.name)
    names.append(m.name)
for extra in sys.argv[1:]:
    importlib.import_module(extra)
stdlib = sys.stdlib_module_names
outside = sorted({n.split(".")[0] for n in set(sys.modules) - before}
                 - set(stdlib) - {"probe_protocol"})
print(json.dumps({"imported": names, "outside": outside}))
"""


def _import_protocol(*extra: str) -> dict:
    # -I -S: as the watchdog starts (no site-packages, no PYTHON* variables)
    out = subprocess.run([sys.executable, "-I", "-S", "-c",
                          f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + PROTOCOL_SCRIPT,
                          *extra], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_protocol_package_imports_only_the_standard_library():
    # WHEN every module of probe_protocol is imported the way the watchdog starts
    got = _import_protocol()
    # THEN each was imported, and nothing outside the standard library came with them
    assert {"probe_protocol.routes", "probe_protocol.runfiles", "probe_protocol.envelope",
            "probe_protocol.bodies", "probe_protocol.query"} <= set(got["imported"]), got
    assert got["outside"] == [], got["outside"]


def test_the_protocol_check_sees_a_module_outside_the_standard_library():
    # probe_cli's click is not stdlib: importing it alongside must show up
    got = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                          + PROTOCOL_SCRIPT, "click"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert "click" in json.loads(got.stdout)["outside"]
