"""Bounded work per request (issue 20, items 1, 2, 7): size caps before parsing, results cut in
bytes as well as rows, no spill to disk, and bad text answered with a 4xx, never a 500."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path

import httpx
import pyarrow as pa
import pytest

ARROW = {"accept": "application/vnd.apache.arrow.stream"}


@pytest.fixture
def small(make_agent):
    """An agent with small caps, so that the tests stay small."""
    agent = make_agent(max_sql_bytes=4096, max_eval_bytes=2048, max_result_bytes=20_000,
                       max_rows=50)
    with httpx.Client(base_url=agent.url, timeout=30) as c:
        yield c


# -- size caps, before anything parses -------------------------------------------------------

def test_sql_over_the_cap_is_413_naming_the_variable(small):
    # GIVEN a statement just over PROBE_MAX_SQL_BYTES (4096 here)
    sql = "SELECT 1" + "+1" * 2045
    # WHEN it is sent
    r = small.post("/v1/query", json={"sql": sql})
    # THEN it is refused with the limit and the variable in one line
    assert r.status_code == 413, r.text
    body = r.json()
    assert body["ok"] is False and body["status"] == 413
    assert "4096" in body["error"] and "PROBE_MAX_SQL_BYTES" in body["error"]
    assert "\n" not in body["error"]


def test_sql_at_the_cap_is_parsed(small):
    sql = "SELECT 1" + " " * (4096 - 8)
    assert small.post("/v1/query", json={"sql": sql}).status_code == 200


def test_a_body_whose_content_length_is_over_the_cap_is_refused_unread(make_agent):
    # GIVEN a request that declares a 10 MB body and sends none of it
    agent = make_agent(max_sql_bytes=4096)
    host, port = agent.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/query HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 10485760\r\n\r\n")
        # WHEN the server answers (it would wait for the body if it read it first)
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    # THEN it is refused on the header alone
    assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
    assert b"PROBE_MAX_SQL_BYTES" in reply


def test_a_chunked_body_over_the_cap_is_refused_while_reading(small):
    def chunks():
        yield b'{"sql": "SELECT 1'
        for _ in range(100):
            yield b"+1" * 5000
        yield b'"}'

    r = small.post("/v1/query", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert "or more" in r.json()["error"]


def test_eval_code_over_the_cap_is_413(small):
    r = small.post("/v1/eval", json={"code": "x = 1\n" * 400})
    assert r.status_code == 413, r.text
    assert "PROBE_MAX_EVAL_BYTES" in r.json()["error"] and "2048" in r.json()["error"]


def test_the_caps_are_settings():
    from probe_agent.config import AgentConfig
    from probe_agent.errors import ConfigError

    cfg = AgentConfig.from_env({"PROBE_MAX_SQL_BYTES": "100", "PROBE_MAX_EVAL_BYTES": "200",
                                "PROBE_MAX_RESULT_BYTES": "300"})
    assert (cfg.max_sql_bytes, cfg.max_eval_bytes, cfg.max_result_bytes) == (100, 200, 300)
    assert AgentConfig().max_sql_bytes == 64 << 10
    assert AgentConfig().max_result_bytes == 16 << 20
    with pytest.raises(ConfigError, match="PROBE_MAX_RESULT_BYTES"):
        AgentConfig.from_env({"PROBE_MAX_RESULT_BYTES": "0"})


# -- bad text and bad JSON: 4xx, never 500 ---------------------------------------------------

@pytest.mark.parametrize("path,body", [
    ("/v1/query", b'{"sql": "SELECT \'\\udcff\'"}'),
    ("/v1/query", b'{"sql": "SELECT 1 -- \\ud800"}'),
    ("/v1/eval", b'{"code": "\'\\udcff\'"}'),
], ids=["query-low-surrogate", "query-high-surrogate", "eval-surrogate"])
def test_a_lone_surrogate_is_400_saying_what_to_send(agent, path, body):
    r = httpx.post(agent.url + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "surrogate" in r.json()["error"] and "UTF-8" in r.json()["error"]


@pytest.mark.parametrize("body", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"sql": ' * 30_000 + b"1" + b"}" * 30_000,
    b'{"sql": "\xff\xfe"}',
    b"SELECT 1",
], ids=["deep-array", "deep-object", "invalid-utf8", "not-json"])
@pytest.mark.parametrize("path", ["/v1/query", "/v1/eval"])
def test_bodies_that_are_not_json_text_are_4xx(agent, path, body):
    r = httpx.post(agent.url + path, content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["ok"] is False


def test_a_wrong_shape_is_still_422(agent):
    r = httpx.post(agent.url + "/v1/query", json={"sql": 1})
    assert r.status_code == 422 and "sql" in r.json()["error"]


def test_the_bodies_are_still_documented(agent):
    spec = httpx.get(agent.url + "/openapi.json").json()
    for path, field in (("/v1/query", "sql"), ("/v1/eval", "code")):
        schema = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert field in schema["schema"]["properties"]


# -- results cut in bytes as well as rows ----------------------------------------------------

def test_a_result_over_the_byte_cap_is_truncated_naming_the_limit(small):
    r = small.post("/v1/query", json={"sql": "SELECT repeat('x', 1000) AS s FROM range(40)"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["truncated"] is True
    assert "PROBE_MAX_RESULT_BYTES" in body["truncated_by"]
    assert 15 <= len(body["rows"]) < 20  # 20,000 bytes of ~1,005-byte rows
    assert len(r.content) < 20_000 + 1000


def test_json_escapes_count_against_the_cap(small):
    """60 MB of chr(1) became a 360 MB reply: each escape is six bytes on the wire."""
    r = small.post("/v1/query", json={"sql": "SELECT repeat(chr(1), 1000) AS s FROM range(40)"})
    body = r.json()
    assert body["truncated"] is True and 2 <= len(body["rows"]) <= 3
    assert body["rows"][0][0] == "\x01" * 1000
    assert len(r.content) < 20_000 + 1000


def test_a_single_value_over_the_cap_never_reaches_python(small):
    r = small.post("/v1/query", json={"sql": "SELECT repeat('x', 1000000) AS s"})
    body = r.json()
    assert body["rows"] == [] and body["truncated"] is True, r.text[:300]
    assert body["columns"] == ["s"] and body["types"] == ["VARCHAR"]


@pytest.mark.parametrize("n,truncated", [(50, False), (51, True)])
def test_the_row_cap_still_holds(small, n, truncated):
    body = small.post("/v1/query", json={"sql": f"SELECT range FROM range({n})"}).json()
    assert len(body["rows"]) == 50 and body["truncated"] is truncated
    assert ("PROBE_MAX_ROWS" in body.get("truncated_by", "")) is truncated


def test_values_and_names_survive_the_size_wrapper(small):
    sql = ("SELECT 1 AS a, 2 AS a, 'nan'::DOUBLE AS f, [1, 2] AS l, {'k': 'v'} AS st, "
           "NULL AS n, DATE '2024-01-02' AS d")
    body = small.post("/v1/query", json={"sql": sql}).json()
    assert body["columns"] == ["a", "a", "f", "l", "st", "n", "d"]
    assert body["rows"] == [[1, 2, "NaN", [1, 2], {"k": "v"}, None, "2024-01-02"]]


@pytest.mark.parametrize("sql", ["SELECT 1 IN (" + ",".join(["1"] * 20000) + ")",
                                 "DESCRIBE python.steps", "SHOW TABLES", "EXPLAIN SELECT 1",
                                 "SUMMARIZE python.steps", "FROM python.steps LIMIT 1"])
def test_read_statements_of_every_kind_still_answer(client, sql):
    r = client.post("/v1/query", json={"sql": sql})
    assert r.status_code == 200, r.text


def test_the_arrow_reply_is_cut_at_the_byte_cap_too(small):
    r = small.post("/v1/query", json={"sql": "SELECT range AS i, repeat('x', 1000) AS s "
                                              "FROM range(40)"}, headers=ARROW)
    assert r.status_code == 200, r.text
    table = pa.ipc.open_stream(r.content).read_all()
    assert table.column_names == ["i", "s"] and 10 <= table.num_rows < 20
    assert r.headers["x-probe-truncated"] == "true"
    assert "PROBE_MAX_RESULT_BYTES" in r.headers["x-probe-truncated-by"]


def test_an_empty_arrow_reply_keeps_its_schema(small):
    r = small.post("/v1/query", json={"sql": "SELECT 1 AS x WHERE false"}, headers=ARROW)
    table = pa.ipc.open_stream(r.content).read_all()
    assert table.column_names == ["x"] and table.num_rows == 0
    assert r.headers["x-probe-truncated"] == "false"


# -- statement checks, now run as a query ----------------------------------------------------

@pytest.mark.parametrize("sql,words", [
    ("DROP TABLE python.steps", "DROP statements are not allowed"),
    ("SELECT 1; SELECT 2", "exactly one statement (got 2)"),
    ("SELECT 1; DROP TABLE python.steps", "exactly one statement"),
    ("EXPLAIN ANALYZE SELECT 1", "EXPLAIN ANALYZE"),
    ("SELCT 1", 'Parser Error: syntax error at or near "SELCT"'),
    ("CREATE TABLE x AS SELECT 1" + " " * 9000, "longer than 8192 bytes"),
    ("EXPLAIN SELECT 1" + " " * 9000, "longer than 8192 bytes"),
])
def test_what_is_not_one_read_statement_is_refused(client, sql, words):
    r = client.post("/v1/query", json={"sql": sql})
    assert r.status_code == 400 and words in r.json()["error"], r.text


# -- no spill to disk ------------------------------------------------------------------------

def test_the_store_never_spills_and_says_so(make_agent, tmp_path, monkeypatch):
    # GIVEN an agent whose DuckDB has 64 MB, started in an empty working directory
    monkeypatch.chdir(tmp_path)
    agent = make_agent(db_memory_mb=64)
    # WHEN a join needs far more than that
    r = httpx.post(agent.url + "/v1/query", timeout=60, json={
        "sql": "SELECT count(*) FROM range(20000000) a(x) JOIN range(20000000) b(y) ON x = y"})
    # THEN DuckDB's own out-of-memory message comes back as a 400, and nothing was written
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith("Out of Memory Error") and "PROBE_DB_MEMORY_MB" in (
        r.json()["error"])
    assert list(Path(tmp_path).rglob("*")) == []
    settings = agent.store.query("SELECT current_setting('temp_directory'), "
                                 "current_setting('max_temp_directory_size'), "
                                 "current_setting('enable_external_access')").rows
    assert settings == [["", "0 bytes", False]]
    assert os.getcwd() == str(tmp_path)


# -- reply bytes are charged to the serving budget -------------------------------------------

def test_reply_bytes_put_the_budget_in_debt_and_the_next_request_waits():
    from probe_agent.serving.budget import BYTE_COST_S, ServeBudget

    budget = ServeBudget(0.5, burst_s=0.05)
    budget.cpu_since_last()
    # WHEN a reply of 20 MB is charged with nothing else in flight
    budget.charge_bytes(20 << 20)
    # THEN the debt is capped at the burst, and the next request waits for it to refill
    assert 20 * (1 << 20) * BYTE_COST_S > 0.05 and budget.tokens == -0.05
    waited = asyncio.run(budget.admit())
    budget.done()
    assert waited > 0


def test_an_unlimited_budget_ignores_bytes():
    from probe_agent.serving.budget import ServeBudget

    budget = ServeBudget(1.0)
    budget.charge_bytes(1 << 30)
    assert budget.tokens == budget.burst_s


def test_json_reply_is_one_valid_document(small):
    r = small.post("/v1/query", json={"sql": "SELECT 'é\"\\' AS s, 1.5 AS f"})
    assert json.loads(r.content)["rows"] == [['é"\\', 1.5]]


def test_a_mid_size_body_through_the_watchdog_is_413_not_502(make_agent):
    """Bodies of 0.4-1 MiB were refused by the agent before it read them; the watchdog's write
    of the rest then broke (EPIPE) and the client got a 502 saying the agent did not answer."""
    # GIVEN an agent behind its watchdog
    agent = make_agent(watchdog=True)
    with httpx.Client(base_url=agent.url, timeout=30) as c:
        for size in (400_000, 700_000, 1_000_000):
            # WHEN a body of that size is sent
            r = c.post("/v1/query", json={"sql": "SELECT 1 -- " + "x" * size})
            # THEN the agent's own 413 comes back, naming the variable
            assert r.status_code == 413, (size, r.text[:300])
            assert "PROBE_MAX_SQL_BYTES" in r.json()["error"]
