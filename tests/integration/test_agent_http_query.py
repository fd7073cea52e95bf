"""The agent's /v1/query route against a real agent (real DuckDB, real uvicorn on
127.0.0.1:0): the wire format and its types, read-only SQL that cannot reach files, extensions
or Python variables, the row cap and the query timeout, reads that flush what they read, and
the Arrow stream. The other routes and how the agent listens: test_agent_http_serving.py."""

from __future__ import annotations

import os

import httpx
import pytest


def test_query_returns_wire_format_with_types(client):
    body = client.post("/v1/query", json={"sql": "SELECT 42 AS answer, 'x' AS s"}).json()
    assert body == {
        "ok": True, "rank": 0, "columns": ["answer", "s"], "types": ["INTEGER", "VARCHAR"],
        "rows": [[42, "x"]], "truncated": False, "elapsed_ms": body["elapsed_ms"],
    }


def test_non_finite_floats_survive_json(client):
    body = client.post("/v1/query", json={"sql": "SELECT 'nan'::DOUBLE, 'inf'::DOUBLE"}).json()
    assert body["rows"] == [["NaN", "Infinity"]]


def test_backtrace_table_resolves_qualified_and_unqualified(client):
    # GIVEN the seed playbook's query, verbatim
    sql = "SELECT func, file, lineno, depth FROM python.backtrace ORDER BY depth LIMIT 10"
    # WHEN
    qualified = client.post("/v1/query", json={"sql": sql}).json()
    bare = client.post("/v1/query", json={"sql": "SELECT count(*) FROM backtrace"}).json()
    # THEN the main thread (this test, blocked in httpx) is in the snapshot
    assert qualified["ok"] and qualified["columns"] == ["func", "file", "lineno", "depth"]
    assert qualified["rows"][0][3] == 0
    funcs = client.post(
        "/v1/query", json={"sql": "SELECT func FROM backtrace WHERE is_main"}
    ).json()["rows"]
    assert ["test_backtrace_table_resolves_qualified_and_unqualified"] in funcs
    assert bare["rows"][0][0] > 0


@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE python.evals",
        "CREATE TABLE x (a INT)",
        "INSERT INTO python.evals VALUES (1, 0, 'c', 'x', 'ok', NULL, 0)",
        "DELETE FROM python.backtrace",
        "ATTACH ':memory:' AS other",
        "SET threads = 8",
        "PRAGMA enable_profiling",
        "EXPLAIN ANALYZE SELECT 1",
        "SELECT 1; DROP TABLE python.evals",
    ],
    ids=["drop", "create", "insert", "delete", "attach", "set", "pragma", "explain-analyze",
         "stacked"],
)
def test_write_and_config_statements_are_refused(client, sql):
    r = client.post("/v1/query", json={"sql": sql})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["ok"] is False and body["status"] == 400 and body["rank"] == 0
    assert "\n" not in body["error"]
    # and the tables are intact
    assert client.post("/v1/query", json={"sql": "SELECT count(*) FROM python.evals"}).json()["ok"]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "COPY (SELECT 1) TO '/tmp/probe-leak.csv'",
        "SELECT * FROM glob('/etc/*')",
        "INSTALL httpfs",
    ],
    ids=["read_csv", "read_text", "copy-to", "glob", "install"],
)
def test_sql_cannot_reach_files_or_extensions(client, sql):
    r = client.post("/v1/query", json={"sql": sql})
    assert r.status_code == 400
    assert not os.path.exists("/tmp/probe-leak.csv")


def test_sql_cannot_see_python_variables(client):
    """Probing runs unknown python."…" names as Python; DuckDB's replacement scans would read
    a caller's variables. Both must be impossible."""
    secret_table = {"token": ["hunter2"]}  # noqa: F841 - the point is that SQL cannot see it
    r = client.post("/v1/query", json={"sql": "SELECT * FROM secret_table"})
    assert r.status_code == 400 and "secret_table" in r.json()["error"]
    r = client.post("/v1/query", json={"sql": 'SELECT * FROM python."os.environ"'})
    assert r.status_code == 400


def test_bad_sql_is_one_line_400(client):
    body = client.post("/v1/query", json={"sql": "SELCT 1"}).json()
    assert body["status"] == 400 and body["error"].startswith("Parser Error")
    assert "\n" not in body["error"]


def test_row_cap_sets_truncated(make_agent):
    agent = make_agent(max_rows=5)
    with httpx.Client(base_url=agent.url) as c:
        body = c.post("/v1/query", json={"sql": "SELECT * FROM range(100)"}).json()
        smaller = c.post("/v1/query", json={"sql": "SELECT * FROM range(100)", "max_rows": 2})
    assert len(body["rows"]) == 5 and body["truncated"] is True
    assert len(smaller.json()["rows"]) == 2


def test_a_read_inserts_what_it_reads_and_no_other_table(make_agent):
    # GIVEN an agent whose timed flush is a minute away, and an audit row queued
    agent = make_agent(flush_ms=60_000)
    with httpx.Client(base_url=agent.url) as c:
        def count_evals() -> int:
            r = c.post("/v1/query", json={"sql": "SELECT count(*) FROM audit"})
            return r.json()["rows"][0][0]

        start = count_evals()
        written = agent.store.rows_written
        agent.audit("test", "x = 1", "ok", None, 1.0, kind="lr")
        # WHEN a client reads another table: the row stays queued (no INSERT for it)
        r = c.post("/v1/query", json={"sql": "SELECT count(*) FROM python.backtrace"})
        assert r.json()["ok"]
        assert agent.store.rows_written == written
        # THEN a read of audit (qualified or not) sees it at once
        assert count_evals() == start + 1 and agent.store.rows_written == written + 1
        # AND a table named only inside a string is still flushed first (no stale read)
        agent.audit("test", "y = 2", "ok", None, 1.0, kind="lr")
        sql = "SELECT count(*) FROM query_table('python.audit')"
        assert c.post("/v1/query", json={"sql": sql}).json()["rows"] == [[start + 2]]


def test_slow_query_is_interrupted_and_agent_keeps_answering(make_agent):
    agent = make_agent(query_timeout_ms=300)
    slow = "SELECT sum(a * b) FROM range(2000000000) x(a), range(50) y(b)"
    with httpx.Client(base_url=agent.url, timeout=30) as c:
        r = c.post("/v1/query", json={"sql": slow})
        after = c.post("/v1/query", json={"sql": "SELECT 1"})
    assert r.status_code == 408, r.text
    assert "PROBE_QUERY_TIMEOUT_MS" in r.json()["error"]
    assert after.json()["rows"] == [[1]]


def test_arrow_stream_round_trips(client):
    import pyarrow as pa

    r = client.post(
        "/v1/query",
        json={"sql": "SELECT range AS i FROM range(1000)"},
        headers={"Accept": "application/vnd.apache.arrow.stream"},
    )
    assert r.headers["content-type"] == "application/vnd.apache.arrow.stream"
    table = pa.ipc.open_stream(r.content).read_all()
    assert table.num_rows == 1000 and table.column_names == ["i"]
    assert r.headers["x-probe-truncated"] == "false"


def test_timestamps_with_time_zone_come_back_as_iso_text(client):
    body = client.post("/v1/query", json={"sql": "SELECT to_timestamp(0) AS t"}).json()
    assert body["ok"], body
    assert body["rows"][0][0].startswith("1970-01-01")


def test_sql_runs_on_threads_that_yield_the_cpu_to_training(make_agent):
    """Before, a heavy query's thread competed with training at the same priority (a 10 s
    query stretched a step x8 on a busy 2-core machine): SQL runs at nice 10, ad-hoc and canned
    on separate threads (at SCHED_IDLE, `probe doctor` took 48 s on a saturated machine), while
    backtraces and evals keep the job's priority."""
    import os
    import threading

    agent = make_agent()
    with httpx.Client(base_url=agent.url, timeout=30) as c:
        assert c.post("/v1/query", json={"sql": "SELECT 1"}).status_code == 200
        canned = c.post("/v1/queries/slow_modules", json={"params": {"last": 5, "limit": 3}})
        assert canned.status_code == 200, canned.text
        assert c.get("/v1/backtrace").status_code == 200

    def policy(prefix: str) -> set[str]:
        out = set()
        for th in threading.enumerate():
            if th.name.startswith(prefix) and th.native_id is not None:
                try:
                    idle = os.sched_getscheduler(th.native_id) == os.SCHED_IDLE
                    nice = os.getpriority(os.PRIO_PROCESS, th.native_id)
                except OSError:
                    continue  # the thread ended meanwhile
                out.add("idle" if idle else f"nice {nice}")
        return out

    # THEN the threads that ran the SQL are in the background, and the other pool's is not
    assert policy("probe-agent.sql") == {"nice 10"}, policy("probe-agent.")
    assert policy("probe-agent.canned") == {"nice 10"}, policy("probe-agent.")
    assert policy("probe-agent.query") <= {"nice 0"}
