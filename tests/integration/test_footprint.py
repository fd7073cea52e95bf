"""The native threads the agent's store brings into a training process: its writer and DuckDB's
allocator thread, and nothing else (bench/bench_footprint.py measures the whole agent).

Counted in a fresh interpreter: thread pools and libarrow's jemalloc are per process, and this
test process has loaded both already.
"""

from __future__ import annotations

import json
import subprocess
import sys

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
