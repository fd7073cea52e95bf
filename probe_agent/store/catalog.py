"""Loads the SQL that ships with the agent: ``schema.sql`` and the canned ``queries/*.sql``.

Where the files are is probe_protocol/sqlfiles.py's to say (the CLI's post-mortem reader uses
the same finder): ``probe_agent/sql`` in a wheel, the repository's ``sql/`` in a checkout.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from probe_protocol import sqlfiles

_HEADER = re.compile(r"^--\s*(name|description|params)\s*:\s*(.*)$")


@dataclass(frozen=True, slots=True)
class CannedQuery:
    name: str
    description: str
    params: tuple[str, ...]
    sql: str


def sql_dir() -> Path:
    """The directory holding schema.sql, wherever this install keeps it (one finder for the
    agent and the CLI: probe_protocol/sqlfiles.py)."""
    return sqlfiles.sql_dir()


def load_schema() -> str:
    return (sql_dir() / "schema.sql").read_text(encoding="utf-8")


def parse_query(name: str, text: str) -> CannedQuery:
    meta = {"name": name, "description": "", "params": ""}
    for line in text.splitlines():
        m = _HEADER.match(line.strip())
        if m:
            meta[m.group(1)] = m.group(2).strip()
    params = tuple(p.strip() for p in meta["params"].split(",") if p.strip())
    return CannedQuery(meta["name"], meta["description"], params, text)


def load_queries() -> dict[str, CannedQuery]:
    qdir = sql_dir() / "queries"
    if not qdir.is_dir():
        return {}
    out = {}
    for path in sorted(qdir.glob("*.sql")):
        q = parse_query(path.stem, path.read_text(encoding="utf-8"))
        out[q.name] = q
    return out


@functools.cache
def shipped_sql(name: str) -> str:
    """The SQL of ``queries/<name>.sql``, read once: for the queries the agent runs itself
    (``/v1/metrics``, the cost of a profile or flame window), so that every statement of the
    project lives in sql/ where the canned-query test runs it."""
    return load_queries()[name].sql
