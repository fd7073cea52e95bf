"""RowBuffer (collectors/row_buffer.py): the rows of one table a small collector gathers, moved
into a real Store on the writer's flush."""

from __future__ import annotations

import pytest

pytest.importorskip("duckdb")


def test_rows_wait_for_start_then_flush_into_their_table_once(store):
    from probe_agent.collectors.row_buffer import RowBuffer

    # GIVEN a buffer of python.metrics rows with room for two
    rows = RowBuffer("python.metrics", cap=2)
    rows.add((1.0, 0, 1, "loss", 0.5))
    assert rows.room() == 1 and not rows.full()
    rows.flush()  # not started: nothing to write to, and nothing is lost
    assert len(rows) == 1
    rows.add((2.0, 0, 2, "loss", 0.25))
    assert rows.full() and rows.room() == 0
    # WHEN it starts on the store and the writer flushes
    rows.start(store)
    rows.flush()
    # THEN the rows are in the table, in order, and the buffer is empty for the next step
    assert store.query("SELECT step, value FROM metrics ORDER BY step").rows == [[1, 0.5],
                                                                               [2, 0.25]]
    assert len(rows) == 0 and rows.room() == 2
    rows.flush()  # nothing buffered: nothing written twice
    assert store.query("SELECT count(*) FROM metrics").rows == [[2]]
