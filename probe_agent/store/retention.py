"""Byte retention for the step tables (PROBE_RETENTION_MB): oldest steps go first.

The step tables are named here, not found by a column called ``step``: a table that happens to
have one (an audit row's step, a future table) is kept whole unless it is listed.

Deleting is not freeing: an in-memory DuckDB keeps a deleted row's blocks until a checkpoint.
Without one the step tables held a flat row count in ever more memory (at PROBE_RETENTION_MB=16:
16, 32, 49, 64, 80, 96 MiB after six budgets of rows), until inserts failed at the memory limit
and rows were lost. ``reclaim`` checkpoints, which frees them and compresses the rows kept
(a budget's rows: 126 -> 41 MiB). A checkpoint that runs out of memory invalidates the whole
database (DuckDB raises a FatalException, and every later query fails), so it runs only with
room for a compressed copy of the rows kept; otherwise it waits for a later pass.
"""

from __future__ import annotations

import duckdb

#: The tables that grow with training and are trimmed by their oldest steps, together.
STEP_TABLES = ("python.steps", "python.torch_trace", "python.memory", "python.metrics",
               "python.step_stats", "python.numerics", "python.host_syncs", "python.moe_load")

#: Rough bytes per row per column type, for retention. Exactness does not matter: the goal is a
#: bound that holds memory flat, and DuckDB compresses below this.
_WIDTH = {"VARCHAR": 48, "BOOLEAN": 1, "INTEGER": 4, "DATE": 4, "FLOAT": 4}


def step_table_widths(columns: dict[str, list[tuple[str, str]]],
                      step_tables: tuple[str, ...] = STEP_TABLES) -> dict[str, int]:
    """Estimated bytes per row of each step table, from its ``(column, type)`` list.

    Raises:
        ValueError: a listed table is missing from the schema or has no ``step`` column
            (schema.sql and this list disagree: a packaging or schema bug, found at start).
    """
    widths = {}
    for table in step_tables:
        cols = columns.get(table)
        if not cols or "step" not in {c for c, _ in cols}:
            raise ValueError(f"retention: step table {table} has no step column in schema.sql")
        widths[table] = sum(_WIDTH.get(t, 8) for _, t in cols)
    return widths


def enforce_retention(cur: duckdb.DuckDBPyConnection, budget: int, step_tables: dict[str, int],
                      rows_est: dict[str, int]) -> tuple[int, int]:
    """Delete the oldest steps until the tables fit ``budget`` bytes; returns the rows deleted
    and their estimated bytes.

    Args:
        cur: the writer's cursor.
        budget: bytes allowed in all step-indexed tables together.
        step_tables: table -> estimated bytes per row.
        rows_est: table -> estimated rows (inserts add to it); corrected here from count(*)
            when the estimate says the budget may be exceeded, and updated after deletes.
    """
    if sum(n * step_tables[t] for t, n in rows_est.items()) <= budget:
        return 0, 0  # cannot be over budget: skip the count(*) queries
    counts = {
        # fetchall, not fetchone: DuckDB >= 2 refuses register() on a cursor that still holds
        # an unfinished result, which would silently stop every later insert.
        t: cur.execute(f"SELECT count(*), min(step), max(step) FROM {t}").fetchall()[0]
        for t in step_tables
    }
    rows_est.clear()
    rows_est.update({t: int(c[0]) for t, c in counts.items() if c})
    used = sum(c[0] * step_tables[t] for t, c in counts.items() if c)
    if used <= budget:
        return 0, 0
    lo = min((c[1] for c in counts.values() if c and c[1] is not None), default=None)
    hi = max((c[2] for c in counts.values() if c and c[2] is not None), default=None)
    if lo is None or hi is None:
        return 0, 0
    # Keep the newest fraction of steps that fits, with 10% headroom, at least one step.
    keep_frac = 0.9 * budget / used
    cutoff = min(max(lo + 1, hi - int((hi - lo + 1) * keep_frac) + 1), hi)
    dropped = dropped_bytes = 0
    for t in step_tables:
        n = cur.execute(f"DELETE FROM {t} WHERE step < ?", [cutoff]).fetchall()[0]
        gone = int(n[0]) if n else 0
        dropped += gone
        dropped_bytes += gone * step_tables[t]
        rows_est[t] = max(0, rows_est.get(t, 0) - gone)
    return dropped, dropped_bytes


def reclaim(cur: duckdb.DuckDBPyConnection, memory_limit: int, live_bytes: int) -> bool:
    """Checkpoint, freeing deleted rows' memory, when there is room to; True if it ran.

    Args:
        cur: the writer's cursor.
        memory_limit: DuckDB's memory_limit in bytes (PROBE_DB_MEMORY_MB).
        live_bytes: the estimated bytes of the rows kept (the width estimate, uncompressed): a
            checkpoint writes them anew, compressed, before it frees the old blocks.
    """
    used = cur.execute("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()"
                       ).fetchall()[0][0]
    # The copy is compressed (a third of the width estimate, measured); half leaves a margin.
    if used + live_bytes / 2 > 0.9 * memory_limit:
        return False  # an out-of-memory checkpoint is fatal to the database (module docstring)
    cur.execute("CHECKPOINT").fetchall()
    return True
