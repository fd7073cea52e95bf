"""Where ``sql/`` is: the one place the agent (store/catalog.py) and the CLI (the post-mortem
reader) find ``schema.sql`` and ``queries/*.sql``.

A wheel keeps the directory inside the agent's package (``probe_agent/sql``, hatch
force-include); a source checkout or an editable install has it beside the packages
(``sql/``). Found from this package's own location, so the CLI never imports the agent to
find it. Stdlib only.
"""

from __future__ import annotations

from pathlib import Path

#: Beside the packages: site-packages (a wheel) or the repository (a checkout).
_BASE = Path(__file__).resolve().parents[1]


def sql_dir() -> Path:
    """The directory holding ``schema.sql`` and ``queries/``.

    Raises:
        FileNotFoundError: neither place has it (a broken install), with what to do.
    """
    for cand in (_BASE / "probe_agent" / "sql", _BASE / "sql"):
        if (cand / "schema.sql").is_file() and (cand / "queries").is_dir():
            return cand
    raise FileNotFoundError(
        f"probe cannot find its sql/ directory (looked in {_BASE / 'probe_agent' / 'sql'} and "
        f"{_BASE / 'sql'}); reinstall with: pip install 'probe-torch[agent]'")


def queries_dir() -> Path:
    return sql_dir() / "queries"


def schema_text() -> str:
    """``schema.sql``: every table and column the agents write, with its documentation."""
    return (sql_dir() / "schema.sql").read_text(encoding="utf-8")
