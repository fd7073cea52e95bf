"""Every sql/queries/*.sql parses and runs against schema.sql on an empty database, and the
agent serves them by name (GET /v1/queries, POST /v1/queries/{name})."""

from __future__ import annotations

import re

import pytest

from probe_agent.store.catalog import load_queries, load_schema

duckdb = pytest.importorskip("duckdb")
QUERIES = load_queries()
_TABLE = re.compile(r"\bpython\.([a-z_]+)")


def _tables_in_schema() -> set[str]:
    return set(re.findall(r"CREATE (?:TABLE|VIEW|OR REPLACE MACRO)(?: IF NOT EXISTS)? "
                          r"python\.([a-z_]+)",
                          load_schema()))


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_canned_query_runs_on_an_empty_database(name):
    q = QUERIES[name]
    missing = set(_TABLE.findall(q.sql)) - _tables_in_schema()
    # A failure, not a skip: a query over a table the schema lacks is broken on every agent
    # (issue 18); a skip here once hid exactly that.
    assert not missing, (f"{name} reads python.{', python.'.join(sorted(missing))}, which "
                         "sql/schema.sql does not create")
    con = duckdb.connect()
    con.execute(load_schema())
    con.execute("SET search_path = 'python,main'")
    assert q.description, f"{name}.sql needs a '-- description:' header"
    con.execute(q.sql, {p: 10 for p in q.params} or None).fetchall()


def test_agent_lists_and_runs_canned_queries(client):
    listed = client.get("/v1/queries").json()
    assert {"pending_collectives", "collective_summary"} <= {q["name"] for q in listed["queries"]}
    ran = client.post("/v1/queries/pending_collectives", json={}).json()
    assert ran["ok"] and ran["rows"] == [] and "waiting_s" in ran["columns"]


def test_unknown_canned_query_is_a_404_naming_the_known_ones(client):
    r = client.post("/v1/queries/nope", json={})
    assert r.status_code == 404
    assert "pending_collectives" in r.json()["error"]


def test_every_look_back_window_is_called_last():
    """One name for one idea: a canned query's look-back window is `last`, never `steps` or
    `last_steps` (which a prefix hack in the CLI once bridged)."""
    windows = {n: q.params for n, q in QUERIES.items() if {"steps", "last_steps"} & set(q.params)}
    assert not windows, f"say `last` for the look-back window: {windows}"


def test_an_older_clients_window_name_still_answers(client):
    # GIVEN a script written when the window was `steps` (slow_modules) or `last_steps`
    old = client.post("/v1/queries/slow_modules", json={"params": {"steps": 5, "limit": 3}})
    older = client.post("/v1/queries/doctor_loop", json={"params": {"last_steps": 5}})
    new = client.post("/v1/queries/slow_modules", json={"params": {"last": 5, "limit": 3}})
    # THEN each gets the rows the new name gets
    assert old.status_code == older.status_code == new.status_code == 200, old.text
    assert old.json()["columns"] == new.json()["columns"]


def test_canned_query_params_are_checked(client):
    r = client.post("/v1/queries/pending_collectives", json={"params": {"x": 1}})
    assert r.status_code == 400 and "unknown: x" in r.json()["error"]
