"""The store's tables: schema.sql creates each whole (no ALTER on a database made fresh at every
start), retention trims the step tables it names and keeps every other table whole, and the
audit log has its own table: python.evals holds evals only."""

from __future__ import annotations

import time

import pytest

duckdb = pytest.importorskip("duckdb")
pa = pytest.importorskip("pyarrow")

from probe_agent.audit import AuditLog  # noqa: E402
from probe_agent.store.catalog import load_schema  # noqa: E402
from probe_agent.store.retention import STEP_TABLES, step_table_widths  # noqa: E402
from probe_agent.store.store import Store  # noqa: E402


def test_schema_sql_creates_each_table_whole():
    # DuckDB's own parser splits the statements (comments hold semicolons)
    kinds = {st.type.name for st in duckdb.connect().extract_statements(load_schema())}
    assert kinds == {"CREATE"}, kinds


def test_only_the_listed_step_tables_are_trimmed():
    # GIVEN a table that has a column named step but is not a step table
    columns = {t: [("step", "BIGINT"), ("rank", "INTEGER")] for t in STEP_TABLES}
    columns["python.audit"] = [("step", "BIGINT"), ("code", "VARCHAR")]
    # THEN retention trims the listed ones only
    assert set(step_table_widths(columns)) == set(STEP_TABLES)
    # AND a listed table without a step column is a schema bug, named at start
    columns["python.steps"] = [("rank", "INTEGER")]
    with pytest.raises(ValueError, match="python.steps has no step column"):
        step_table_widths(columns)


def _memory_rows(store: Store, n: int) -> pa.Table:
    schema = store.arrow_schema("python.memory")
    cols = {f.name: [None] * n for f in schema}
    cols |= {"timestamp": [time.time()] * n, "rank": [0] * n, "step": list(range(1, n + 1)),
             "device": ["cpu"] * n, "rss": [1000.0] * n}
    return pa.table(cols, schema=schema)


def test_retention_keeps_the_audit_log_whole(store):
    # GIVEN audit rows, then more memory rows than PROBE_RETENTION_MB (1) holds
    audit = AuditLog(store, rank=0)
    for i in range(50):
        audit.record("c", f"x = {i}", "ok", None, 1.0, kind="step-eval", at_step=i)
    assert set(store._step_tables) == set(STEP_TABLES)
    n = 2 * (1 << 20) // store._step_tables["python.memory"]
    store.append("python.memory", _memory_rows(store, n))
    # WHEN retention has trimmed the step tables
    deadline = time.monotonic() + 15
    while store.query("SELECT min(step) FROM python.memory").rows[0][0] == 1:
        assert time.monotonic() < deadline, "retention never trimmed python.memory"
        store.flush(timeout=1.0)
    # THEN every audit row is still there
    assert store.query("SELECT count(*) FROM python.audit").rows == [[50]]


def test_an_eval_goes_to_evals_and_audit_an_action_to_audit_only(store):
    audit = AuditLog(store, rank=3)
    audit.record("unix:uid=0", "1 + 1", "ok", None, 2.0)
    audit.record("unix:uid=0", "lr scale=0.5", "queued", None, 0.0, kind="lr",
                 action_id="a1", at_step=7, requested_by="me@host")
    evals = store.query("SELECT rank, code, outcome FROM python.evals").rows
    assert evals == [[3, "1 + 1", "ok"]]
    rows = store.query("SELECT kind, code, action_id, at_step, requested_by FROM python.audit "
                       "ORDER BY timestamp, kind").rows
    assert rows == [["eval", "1 + 1", None, None, None],
                    ["lr", "lr scale=0.5", "a1", 7, "me@host"]]
