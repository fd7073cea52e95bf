"""What the agent's store costs a training process (bench/bench_footprint.py measures the whole
agent): its threads (the writer, the query deadline and DuckDB's allocator thread, and no
native pool), and memory that retention holds to its budget and DuckDB's limit follows.

Threads are counted in a fresh interpreter: thread pools and libarrow's jemalloc are per
process, and this test process has loaded both already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_CHILD = r"""
import json, os, sys
def comms():
    return [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
import duckdb, numpy  # numpy: its BLAS pool is the job's (torch imports numpy too)
before = comms()
from probe_agent.config import AgentConfig
from probe_agent.store.store import Store
store = Store(AgentConfig(port=0, retention_mb=1))
store.start()
store.query("SELECT count(*) FROM python.torch_trace")
after_store = comms()
from probe_agent.collectors.tracer.trace_rows import RowResolver
resolver = RowResolver(0, store.arrow_schema("python.torch_trace"))
resolver._con().execute("SELECT 1").fetchall()
after_tracer_db = comms()
print(json.dumps({"before": before, "store": after_store, "tracer_db": after_tracer_db,
                  "conf_left": os.environ.get("JE_ARROW_MALLOC_CONF")}))
os._exit(0)
"""


def _threads(env_extra: dict[str, str] | None = None) -> dict[str, list[str]]:
    import os

    env = dict(os.environ, **(env_extra or {}))
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_store_and_tracer_db_start_no_native_pools() -> None:
    # GIVEN a fresh process, WHEN the store starts, runs a query, and the tracer's own database
    # opens
    got = _threads()
    # THEN the store adds its writer, the query deadline and DuckDB's allocator thread (no
    # asynchronous-I/O pool: DuckDB 2 starts 8 such threads per database by default), libarrow's
    # jemalloc starts no background thread, and the tracer's database adds none
    added = len(got["store"]) - len(got["before"])
    assert added == 3, got
    assert "jemalloc_bg_thd" not in got["store"], got
    assert len(got["tracer_db"]) == len(got["store"]), got
    # AND the variable that switched it off is gone again (children never inherit it)
    assert got["conf_left"] is None


def test_a_jobs_own_jemalloc_options_are_left_alone() -> None:
    # GIVEN the job set libarrow's jemalloc options itself
    got = _threads({"JE_ARROW_MALLOC_CONF": "background_thread:true"})
    # THEN they are the job's: its background thread runs, and the variable stays
    assert "jemalloc_bg_thd" in got["store"], got
    assert got["conf_left"] == "background_thread:true"


def test_retention_frees_what_it_deletes() -> None:
    """An in-memory DuckDB frees deleted rows only at a checkpoint: before ``reclaim``, the step
    tables held a flat row count in memory that grew by about a budget per budget of rows,
    until inserts failed at the memory limit."""
    import duckdb

    from probe_agent.store.catalog import load_schema
    from probe_agent.store.retention import (
        STEP_TABLES,
        enforce_retention,
        reclaim,
        step_table_widths,
    )

    # GIVEN the agent's schema in an in-memory DuckDB, and a 2 MiB budget for the step tables
    con = duckdb.connect(":memory:", config={"threads": 1, "async_threads": 0})
    con.execute(load_schema())

    def columns(table: str) -> list[tuple[str, str]]:
        return con.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE "
                           "schema_name || '.' || table_name = ? ORDER BY column_index",
                           [table]).fetchall()

    widths = step_table_widths({t: columns(t) for t in STEP_TABLES})
    budget = 2 << 20
    per_round = int(1.5 * budget / widths["python.torch_trace"])
    select = ", ".join("range // 200 + ? AS step" if c == "step" else
                     (f"'blocks.' || (range % 200) || '.mlp' AS {c}" if t == "VARCHAR" else
                      f"CAST(range % 997 AS {t}) AS {c}" if t not in ("TIMESTAMP", "JSON")
                      else f"NULL AS {c}") for c, t in columns("python.torch_trace"))
    rows_est: dict[str, int] = {}

    def table_mib() -> float:
        return con.execute("SELECT coalesce(sum(memory_usage_bytes), 0) / 2^20 FROM "
                           "duckdb_memory() WHERE tag = 'IN_MEMORY_TABLE'").fetchall()[0][0]

    # WHEN six budgets' worth of newer and newer steps arrive, each trimmed and reclaimed
    seen = []
    for r in range(6):
        con.execute(f"INSERT INTO python.torch_trace SELECT {select} FROM range({per_round})",
                    [r * 10_000])
        rows_est["python.torch_trace"] = rows_est.get("python.torch_trace", 0) + per_round
        dropped, _ = enforce_retention(con, budget, widths, rows_est)
        assert dropped > 0 or r == 0
        live = rows_est["python.torch_trace"] * widths["python.torch_trace"]
        assert reclaim(con, 512 * 10**6, live) or r == 0
        seen.append(round(table_mib(), 1))
    # THEN the tables' memory stays within the budget instead of growing with every round
    assert max(seen) <= 2.0, seen
    # AND with no room under the memory limit, reclaim does not risk a fatal checkpoint
    assert not reclaim(con, 10**6, live)


def test_duckdb_memory_limit_follows_the_retention_unless_set() -> None:
    from probe_agent.config import DB_QUERY_ROOM_MB, AgentConfig

    # GIVEN no PROBE_DB_MEMORY_MB: the limit grows with the retention (a 1 GB budget under a
    # fixed 512 MB limit would have failed its inserts)
    assert AgentConfig.from_env({}).db_memory_limit_mb == 2 * 128 + DB_QUERY_ROOM_MB
    assert AgentConfig.from_env({"PROBE_RETENTION_MB": "1024"}).db_memory_limit_mb == (
        2 * 1024 + DB_QUERY_ROOM_MB)
    # AND a set value wins, and is validated as before
    assert AgentConfig.from_env({"PROBE_DB_MEMORY_MB": "300"}).db_memory_limit_mb == 300
    with pytest.raises(Exception, match="PROBE_DB_MEMORY_MB"):
        AgentConfig.from_env({"PROBE_DB_MEMORY_MB": "0"})


def test_watchdog_without_tls_loads_no_openssl(make_agent) -> None:
    """libssl and libcrypto were 5 of the watchdog's 22.6 MiB RSS; without TLS it needs
    neither (asyncio runs without ssl, token checks use Python's own sha256)."""
    import time

    from tests.support import wait_until

    # GIVEN an agent with its watchdog and no TLS
    agent = make_agent(watchdog=True)
    pid = wait_until(lambda: (agent.info().watchdog or {}).get("pid"), 30, "no watchdog pid")
    # WHEN it has started and answered a request through the watchdog
    import httpx

    assert httpx.get(agent.url + "/v1/health", timeout=30).status_code == 200
    time.sleep(0.2)
    # THEN no OpenSSL library is mapped into the watchdog process
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read()
    assert "libssl" not in maps and "libcrypto" not in maps


def test_the_memory_table_carries_the_stores_own_memory(make_agent) -> None:
    """agent_mib comes through the Sink (Store.memory_bytes), not the store's private cursor."""
    torch = pytest.importorskip("torch")
    from tests.support import wait_until

    # GIVEN an agent and a loop that steps
    agent = make_agent()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def agent_mib() -> list | None:
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        agent.store.flush()
        rows = agent.store.query(
            "SELECT agent_mib, rss FROM python.memory WHERE agent_mib > 0").rows
        return rows[-1] if rows else None

    # WHEN the writer samples DuckDB's memory (every ~2 s; the first sample, before any row
    # was inserted, can be 0), THEN a later step row carries it, less than the whole process
    wait_until(lambda: agent_mib() is not None, 30, "no step row carried a non-zero agent_mib")
    mib, rss = agent_mib()
    assert 0 < mib < rss, (mib, rss)
