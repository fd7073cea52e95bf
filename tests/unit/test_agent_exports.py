"""probe_agent's public surface is pinned (issue 18, item 7): what ``import probe_agent`` offers,
and that it stays light (no duckdb, fastapi, pyarrow or torch until ``start()``)."""

from __future__ import annotations

import subprocess
import sys

import probe_agent
from tests.support import python_env


def test_all_is_pinned_and_every_name_exists():
    # A name added to (or dropped from) the public API is a decision: change this list with it.
    assert probe_agent.__all__ == ["__version__", "log", "start", "stop"]
    for name in probe_agent.__all__:
        assert hasattr(probe_agent, name), name


def test_import_probe_agent_imports_nothing_heavy_and_offers_only_its_api():
    code = ("import sys, probe_agent; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'duckdb', 'fastapi', 'uvicorn', 'pyarrow', 'torch'})); "
            "print(sorted(n for n in vars(probe_agent) if not n.startswith('_')))")
    out = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    heavy, public = out.stdout.splitlines()
    assert heavy == "[]"
    # besides its API, only what its own imports bind (typing helpers, sys)
    assert set(eval(public)) - set(probe_agent.__all__) <= {"annotations", "sys",
                                                             "TYPE_CHECKING", "Any"}
