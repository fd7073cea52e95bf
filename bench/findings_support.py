"""What every file of red-team findings shares (security_findings.py, findings_disk.py,
findings_serving.py): the attacker's code and the CLI run in this process.

``python bench/security_findings.py`` puts bench/ on sys.path (the script's own directory), so
the findings files it loads import this as ``findings_support``. The attacker's code is always
this checkout's tests/attackers.py, whatever checkout is under test (PROBE_SRC).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]


def _attackers() -> Any:
    """This checkout's tests/attackers.py, whatever checkout is under test."""
    spec = importlib.util.spec_from_file_location("attackers", HERE / "tests" / "attackers.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


attackers = _attackers()


def cli(*argv: str) -> tuple[int, str, str]:
    """``probe ARGV`` of the code under test, in this process: (exit code, stdout, stderr)."""
    from probe_cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()
