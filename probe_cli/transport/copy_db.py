"""The CLI's DuckDB over one rank's post-mortem copy, locked down as the agent's own store is.

A copy is files on disk, and the owner may read one that someone else packed (a tarball from a
colleague, a directory in a shared root), so ``probe -t DIR steps`` must not let the copy run
anything. Before: ``read_csv('/etc/shadow')``, ``glob``, ``COPY ... TO``, ``ATTACH``,
``INSTALL`` and ``SET`` ran in this DuckDB, and table names taken from file names went
unescaped into ``CREATE VIEW``. Now:

- it reads only the copy's own Parquet parts: ``allowed_paths`` lists them, then
  ``enable_external_access=false`` (no other file, no network, no ATTACH, COPY or INSTALL),
  extension autoload and autoinstall off, Python replacement scans off, no spilling to disk,
  and ``lock_configuration=true`` (no SET);
- table names come from file names, so they are data: only layout names (``[A-Za-z0-9_]``,
  as the agent writes them) become views, always quoted; a part named otherwise is left out,
  with a line saying so;
- the user's SQL must be one read statement, by the agent's own rule
  (probe_protocol/read_only_sql.py).
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any

from probe_protocol import postmortem as layout
from probe_protocol.read_only_sql import (
    CLASSIFY_SQL,
    SqlRefusedError,
    check_read_only,
    one_line,
)

from ..transport.untrusted_text import escape_controls

_TABLE = re.compile(r"[A-Za-z0-9_]{1,64}")
#: What the CLI's DuckDB may never do, set at connect time.
_CONFIG: dict[str, Any] = {
    "autoload_known_extensions": False, "autoinstall_known_extensions": False,
    "python_enable_replacements": False, "temp_directory": ""}


def is_table_name(name: str) -> bool:
    """A table name as the agent writes them; anything else in a file name is not one."""
    return bool(_TABLE.fullmatch(name))


def is_parquet(path: str) -> bool:
    """A whole Parquet file: ``PAR1`` at both ends around a footer that fits (a zero-length or
    cut part, from a full disk or a crafted copy, is not; it is left out, not read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < 12:
            return False
        head = f.read(4)
        f.seek(st.st_size - 8)
        tail = f.read(8)
    footer = int.from_bytes(tail[:4], "little")
    return head == b"PAR1" and tail[4:] == b"PAR1" and footer + 12 <= st.st_size


def table_parts(rank_path: str, problems: list[str]) -> dict[str, list[str]]:
    """A rank's tables and their readable parts; a part that is not whole, or whose name is
    not a table name, is noted in ``problems`` once and left out."""
    out: dict[str, list[str]] = {}
    for table, files in layout.table_files(rank_path).items():
        if not is_table_name(table):  # a file name is data, never SQL
            note = f"a part named {escape_controls(table)!r} is not a table name: left out"
            if note not in problems:
                problems.append(note)
            continue
        good = [p for p in files if is_parquet(p)]
        for p in files:
            if p not in good:
                note = f"{escape_controls(p)} is not a whole Parquet file: left out"
                if note not in problems:
                    problems.append(note)
        if good:
            out[table] = good
    return out


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def connect(parts: dict[str, list[str]], views: list[str], problems: list[str]) -> Any:
    """A DuckDB with a ``python."<table>"`` view over each table's ``parts`` and the schema's
    ``views``, locked (module docstring). A table name that is not a layout name goes to
    ``problems`` and is left out."""
    import duckdb  # lazy: the CLI needs it only for a post-mortem copy

    tables = {}
    for table, files in parts.items():
        if is_table_name(table):
            tables[table] = files
        else:
            problems.append(f"a part named {table!r} is not a table name: left out")
    db = duckdb.connect(":memory:", config=dict(_CONFIG))
    try:
        files = [p for ps in tables.values() for p in ps]
        db.execute(f"SET allowed_paths = [{', '.join(map(_literal, files))}]")
        db.execute("SET enable_external_access = false")
        db.execute("CREATE SCHEMA IF NOT EXISTS python")
        for table, ps in tables.items():
            db.execute(f'CREATE VIEW python."{table}" AS SELECT * FROM '
                       f"read_parquet([{', '.join(map(_literal, ps))}], union_by_name = true)")
        for view in views:
            try:
                db.execute(view)
            except duckdb.Error:
                pass  # a table it reads was not copied: the view is missing, as the table
        db.execute("SET search_path = 'python,main'")
        db.execute("SET lock_configuration = true")
    except BaseException:
        db.close()
        raise
    return db


def check(db: Any, sql: str) -> None:
    """Raise SqlRefusedError unless ``sql`` is one read statement."""
    import duckdb

    def classify(text: str) -> Any:
        rows = db.execute(CLASSIFY_SQL, [text]).fetchall()
        return rows[0] if rows else None

    def kinds(text: str) -> list[str]:
        try:
            return [st.type.name for st in db.extract_statements(text)]
        except duckdb.Error as e:
            raise SqlRefusedError(one_line(e)) from None

    check_read_only(sql, classify, kinds, tables="a post-mortem copy's tables")

