"""Every table's batches, as the collectors produce them in a short real run, have exactly the
columns and types sql/schema.sql declares (issue 18, item 5).

A batch with a column too few, a column out of order or a type that differs is not refused by
DuckDB: it is cast, or its missing columns become NULL rather than their DEFAULT, so a
hand-written Arrow schema that drifted from the DDL would go unnoticed. Collectors take their
schema from the sink (``Sink.arrow_schema``, read from schema.sql); this test holds them to it.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("duckdb")

import probe_agent  # noqa: E402
from probe_agent.store import Store  # noqa: E402
from tests.integration.tracing_support import TinyGPT, rows, train  # noqa: E402
from tests.support import ddl_schemas  # noqa: E402


class MoeBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.top_k = 2
        self.gate = torch.nn.Linear(8, 4)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: Any) -> Any:
        return self.gate(x)


class WithMoe(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gpt = TinyGPT()
        self.moe = MoeBlock()

    def forward(self, idx: Any, tgt: Any) -> Any:
        return self.gpt(idx, tgt) + 0 * self.moe(torch.randn(4, 8)).sum()


@pytest.fixture
def produced(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every batch appended to a store, and every materializer's table, by table name."""
    out: dict[str, list[Any]] = {}
    append, add_materializer = Store.append, Store.add_materializer

    def recording_append(self: Store, table: str, data: Any) -> None:
        out.setdefault(table, []).append(data)
        append(self, table, data)

    def recording_materializer(self: Store, table: str, fn: Any) -> None:
        def materialize() -> Any:
            data = fn()
            out.setdefault(table, []).append(data)
            return data

        add_materializer(self, table, materialize)

    monkeypatch.setattr(Store, "append", recording_append)
    monkeypatch.setattr(Store, "add_materializer", recording_materializer)
    return out


def test_every_tables_batches_match_its_ddl(make_agent, produced):
    # GIVEN an agent tracing every step of a real training loop that logs a metric
    agent = make_agent(trace="on")
    torch.manual_seed(0)
    model = WithMoe()  # python.moe_load: a top-2 router the agent finds on its own
    train(model, 3)
    probe_agent.log(loss=1.5)
    # WHEN an eval is audited and every table is read (materialised tables are built then)
    agent.run_eval("1 + 1", "test")
    # python.ooms is written when the CUDA allocator runs out; on CPU, a record with the keys
    # its observer fills (collectors/oom.py) goes through the same flush
    agent.collectors.oom.add({
        "timestamp": 1.0, "rank": 0, "step": 3, "device": "cuda:0", "request_mib": 512.0,
        "device_allocated_mib": 1.0, "device_free_mib": 2.0, "capacity_mib": 3.0,
        "allocated_mib": 4.0, "reserved_mib": 5.0, "active_mib": 4.0, "inactive_split_mib": 1.0,
        "largest_free_block_mib": 0.5, "fragmented": True, "ooms": 1, "alloc_retries": 2,
        "params_mib": 1.0, "grads_mib": 1.0, "optimizer_mib": 2.0, "activations_mib": None,
        "stack": ["train.py:10 main"], "snapshot": None})
    ddl = ddl_schemas()
    for table in ddl:
        rows(agent, f"SELECT * FROM {table}")
    # THEN every table got batches, each with the DDL's columns, order and types
    assert set(produced) == set(ddl), f"no batches for {set(ddl) - set(produced)}"
    for table, batches in produced.items():
        for batch in batches:
            assert batch.schema.equals(ddl[table]), (
                f"{table}: a batch has\n{batch.schema}\nbut schema.sql says\n{ddl[table]}")
