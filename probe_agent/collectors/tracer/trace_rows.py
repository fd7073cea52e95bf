"""RowResolver: the tracer's records -> Arrow tables for ``python.torch_trace`` (writer thread).

The training thread records numbers only (``tracer.py``, formats in ``trace_columns.py``): two
``perf_counter_ns`` stamps, step, kind and depth per call, the sequence number of the call's
output ``grad_fn``, and per backward event the time a ``grad_fn`` pre-hook fired and for which
node. Everything else happens here, in SQL on a private in-memory DuckDB, which runs without
the GIL: the training thread waited for this writer's Python (~0.75 ms per traced step on the
bench GPT) when it resolved rows one by one.

- **names**: ``trace_names.py`` gives each row's module a code; SQL joins the strings in.
- **seq**: the call index of a module within its step and kind (0, 1, … for a module called
  several times: shared layers, gradient accumulation). Recompute calls count on their own, so
  a reentrant checkpoint's backward (which hangs off the recompute call) gets the seq of the
  original forward. The last steps' forward rows stay in ``fwd`` so a step split over two
  flushes counts on, and so backward events find their calls.
- **backward spans**: an event of node ``g`` starts the backward of the forward calls whose
  output had ``grad_fn`` ``g``. A span ends at the first event of its pass (from its own on)
  of the node of its call's input (the gradient for the input is done), or at the first later
  event of its pass that has a call disjoint from it in the forward (neither nested in it nor
  around it; recompute calls never end spans of the original forward), whichever comes first;
  otherwise at the pass end.
- **CUDA**: durations from event pairs once the end event completed (``query()``); rows whose
  events are not done yet wait for the next flush (never a synchronize). The events stay Python
  objects in lists beside the records; rows refer to them by index (``c0``, ``c1``).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from .saved_bytes import INPUT, SAVED, SV_N
from .trace_columns import (
    BACKWARD,
    BW_CUDA,
    BW_N,
    FORWARD,
    FW_CUDA,
    FW_KIND,
    FW_N,
    KEEP_STEPS,
    OPT_STEP,
    PASS_END,
    RECOMPUTE,
    records,
)
from .trace_names import ModuleNames

_MAX_PENDING = 50_000
_NEAR = 5  # a span's next _NEAR - 1 events are probed by equality before a join over its pass

_SETUP = """
CREATE TABLE fwd (id BIGINT, t0 BIGINT, t1 BIGINT, step BIGINT, kind TINYINT, depth INTEGER,
                  gseq BIGINT, code INTEGER, seq INTEGER, c0 BIGINT, igseq BIGINT);
CREATE TABLE sv (t BIGINT, nbytes BIGINT, kind TINYINT);
CREATE TABLE owned (fid BIGINT, saved BIGINT, inputs BIGINT);
CREATE TABLE sv_steps (step BIGINT);
"""
# Saved-tensor records (saved_bytes.py) -> the innermost module call whose forward span holds
# each: that call's OWN saved bytes. A record with no span around it yet belongs to a call still
# running (its row comes in a later flush; a child ends, and is taken, before its parent), so
# it waits in sv; one older than the last root call's end was saved outside every module.
# Calls at one depth follow each other, so per depth the only candidate is the latest call
# started before the record (an ASOF join); the deepest candidate still running holds it.
# (A range join, and a correlated range DELETE, took ~1.2 s of writer CPU per 10k calls.)
_OWN_SAVED = """
DELETE FROM owned;
CREATE OR REPLACE TEMP TABLE sv_call AS
SELECT s.rid, any_value(s.nbytes) AS nbytes, any_value(s.kind) AS kind,
       arg_max(f.id, f.depth) AS fid
FROM (SELECT rowid AS rid, t, nbytes, kind FROM sv) s
CROSS JOIN (SELECT DISTINCT depth FROM fwd WHERE kind <> {opt_step}) d
ASOF JOIN (SELECT id, t0, t1, depth FROM fwd WHERE kind <> {opt_step}) f
       ON f.depth = d.depth AND f.t0 <= s.t
WHERE s.t <= f.t1
GROUP BY s.rid;
INSERT INTO owned
SELECT fid, sum(nbytes) FILTER (WHERE kind = {saved}), sum(nbytes) FILTER (WHERE kind = {input})
FROM sv_call GROUP BY fid;
DELETE FROM sv WHERE rowid IN (SELECT rid FROM sv_call)
   OR t < (SELECT max(t1) FROM fwd WHERE depth = 0 AND kind <> {opt_step});
"""
# New forward records ({id0}: id of the first; {c0}: each one's CUDA entry, _CUDA_INDEX).
_INSERT = """
INSERT INTO fwd
SELECT n.id, n.t0, n.t1, n.step, n.kind, n.depth, n.gseq, n.code,
       (coalesce(b.c, 0) + row_number() OVER (PARTITION BY n.step, n.code, n.kind
                                              ORDER BY n.id) - 1)::INTEGER,
       n.c0, n.igseq
FROM (SELECT {id0} + i AS id, r[1] AS t0, r[2] AS t1, r[3] AS step, r[4]::TINYINT AS kind,
             r[5]::INTEGER AS depth, r[6] AS gseq, code,
             {c0} AS c0, r[8] AS igseq
      FROM new_rows) n
LEFT JOIN (SELECT step, code, kind, count(*) AS c FROM fwd GROUP BY ALL) b
       ON b.step = n.step AND b.code = n.code AND b.kind = n.kind
"""
# A recompute call runs with no module around it (the training thread's depth is 0 inside
# backward), so it takes the depth of the original call it repeats (same step, module and
# seq): self time nests calls by depth, and the backward rows of a reentrant checkpoint's
# inner pass (which hang off recompute calls) then nest inside the checkpointed layer's.
_RECOMPUTE_DEPTH = """
UPDATE fwd SET depth = o.depth
FROM (SELECT step, code, seq, depth FROM fwd WHERE kind = {forward}) o
WHERE fwd.id >= {id0} AND fwd.kind = {recompute}
  AND o.step = fwd.step AND o.code = fwd.code AND o.seq = fwd.seq
"""
# This flush's forward rows and the backward rows of its events, in torch_trace's columns
# plus c0/c1 (CUDA event indexes) and kind.
_OUTPUT = """
WITH e AS (
  SELECT i AS eid, r[1] AS t, r[2] AS gseq,
         {b0} AS bc,
         coalesce(sum((r[2] = {pass_end})::INTEGER) OVER (
           ORDER BY i ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS pass
  FROM new_events),
ends AS (SELECT pass, t AS t_end, bc AS bc_end FROM e WHERE gseq = {pass_end}),
p0 AS (
  SELECT e.eid, e.t, e.pass, e.bc, f.id AS fid, f.t0, f.t1, f.kind, f.step, f.code, f.seq,
         f.depth, f.igseq
  FROM e JOIN fwd f ON f.gseq = e.gseq AND f.t1 <= e.t
  WHERE e.gseq >= 0
  QUALIFY row_number() OVER (PARTITION BY e.pass, f.id ORDER BY e.eid) = 1),
-- k numbers the events that start spans (events of input nodes only are left out), so the
-- near probe below steps over them
p AS (SELECT p0.*, dense_rank() OVER (PARTITION BY pass ORDER BY eid) AS k FROM p0),
-- the first later event of the pass with a call disjoint from a's: most spans end within a
-- few events (probed by equality, cheap), the rest (containers) by a join over their pass
near AS MATERIALIZED (
  SELECT a.pass, a.fid, min(b.eid) AS beid
  FROM (SELECT p.*, p.k + d.d AS target FROM p CROSS JOIN range(1, {near}) d(d)) a
  JOIN p b ON b.pass = a.pass AND b.k = a.target
  WHERE {ends_span}
  GROUP BY a.pass, a.fid),
un AS MATERIALIZED (
  SELECT a.* FROM p a LEFT JOIN near n ON n.pass = a.pass AND n.fid = a.fid
  WHERE n.beid IS NULL),
far AS (
  SELECT a.pass, a.fid, min(b.eid) AS beid
  FROM un a
  JOIN p b ON b.pass = a.pass AND b.k >= a.k + {near}
  WHERE {ends_span}
  GROUP BY a.pass, a.fid),
-- autograd reaching the node of a's input (at or after a's start): a's backward is done, and
-- what runs until the next span starts belongs to the calls around a
fin AS (
  SELECT a.pass, a.fid, min(b.eid) AS beid
  FROM p a JOIN e b ON b.gseq = a.igseq AND b.pass = a.pass AND b.eid >= a.eid
  WHERE a.igseq >= 0
  GROUP BY a.pass, a.fid),
fins AS (
  SELECT pass, fid, min(beid) AS beid
  FROM (SELECT * FROM near UNION ALL SELECT * FROM far UNION ALL SELECT * FROM fin)
  GROUP BY pass, fid),
bwd AS (
  SELECT a.t AS t0, coalesce(be.t, en.t_end) AS t1, a.step, a.seq, a.code,
         {backward}::TINYINT AS kind, a.depth, a.bc AS c0, CASE WHEN be.eid IS NULL THEN en.bc_end
                                                       ELSE be.bc END AS c1, NULL::BIGINT AS id
  FROM p a JOIN ends en ON en.pass = a.pass
  LEFT JOIN fins k ON k.pass = a.pass AND k.fid = a.fid
  LEFT JOIN e be ON be.eid = k.beid),
x AS (
  SELECT t0, t1, step, seq, code, kind, depth, c0, NULL::BIGINT AS c1, id FROM fwd
  WHERE id >= {id0}
  UNION ALL SELECT * FROM bwd)
SELECT (x.t0 + {off})::DOUBLE * 1e-9 AS timestamp, {rank}::INTEGER AS rank, x.step,
       x.seq::INTEGER AS seq, nm.module,
       CASE x.kind WHEN {backward} THEN 'backward' WHEN {opt_step} THEN 'step'
                   ELSE 'forward' END AS stage,
       (x.t1 - x.t0)::DOUBLE * 1e-9 AS duration, (x.t1 - x.t0)::DOUBLE * 1e-9 AS cpu_duration,
       0.0::DOUBLE AS allocated, 0.0::DOUBLE AS max_allocated, 0.0::DOUBLE AS cached,
       0.0::DOUBLE AS max_cached, nm.root, x.kind = {recompute} AS recompute, 'cpu' AS device,
       x.depth::INTEGER AS depth, x.c0, x.c1, x.kind,
       CASE WHEN x.kind IN ({forward}, {recompute}) AND x.step IN (SELECT step FROM sv_steps)
            THEN coalesce(o.saved, 0) END AS saved_bytes,
       CASE WHEN x.kind IN ({forward}, {recompute}) AND x.step IN (SELECT step FROM sv_steps)
            THEN coalesce(o.inputs, 0) END AS input_bytes
FROM x JOIN names nm ON nm.code = x.code
LEFT JOIN owned o ON o.fid = x.id
"""
# Event b ends span a: b has a call disjoint from a's in the forward, and is no recompute call
# ending a span of the original forward.
_OUTPUT = _OUTPUT.replace("{ends_span}", "(b.t1 <= a.t0 OR b.t0 >= a.t1) "
                          "AND (a.kind = {recompute} OR b.kind <> {recompute})")
_KINDS = {"pass_end": PASS_END, "backward": BACKWARD, "opt_step": OPT_STEP,
          "recompute": RECOMPUTE, "forward": FORWARD}
# A record's index into the CUDA entries of its flush ({} is the first entry's), when it has one.
_CUDA_INDEX = "CASE WHEN r[{}] = 1 THEN ({} + sum(r[{}]) OVER (ORDER BY i) - 1)::BIGINT END"
_PRUNE = f"DELETE FROM fwd WHERE step < (SELECT max(step) FROM fwd) - {KEEP_STEPS}"
_EMPTY = pa.table({"i": pa.array([], pa.int64()),
                   "r": records(array("q"), BW_N)})
_CUDA, _CPU = pa.scalar("cuda", pa.string()), pa.scalar("cpu", pa.string())
_MEM_COLS = ("allocated", "max_allocated", "cached", "max_cached")


class RowResolver:
    """Resolves one flush of records at a time; keeps what later flushes need (the last
    steps' forward rows, names, rows whose CUDA events are still running)."""

    def __init__(self, rank: int, schema: pa.Schema,
                 optimizers: Callable[[], list[Any]] = list, memory_mb: int = 512) -> None:
        """``optimizers``: the step clock's (``StepClock.optimizers``), for module names.
        ``memory_mb``: this database's memory_limit (PROBE_DB_MEMORY_MB's; DuckDB's own
        default is 80% of the machine's memory)."""
        self.rank = rank
        self.memory_mb = memory_mb
        self.schema = schema  # python.torch_trace as the store has it (schema.sql)
        self.torch: Any = None
        # perf_counter_ns -> nanoseconds since the epoch
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self.names = ModuleNames(optimizers)
        self._names_version = -1
        self._db: duckdb.DuckDBPyConnection | None = None
        self._next_row = 0  # id of the next forward record
        self._next_fc = 0  # index of the next forward CUDA event pair
        self._next_bc = 0  # index of the next backward CUDA event
        self._fev: dict[int, tuple[Any, Any, Any]] = {}  # c0 -> (ev0, ev1, memory)
        self._bev: dict[int, tuple[Any, Any]] = {}  # bc -> (event, memory)
        self._pending: pa.Table | None = None  # rows waiting for their CUDA events
        self._sv_waiting = False  # sv holds records of calls not resolved yet

    def _con(self) -> duckdb.DuckDBPyConnection:
        if self._db is None:
            self._db = duckdb.connect(":memory:", config={
                "threads": 1, "async_threads": 0, "memory_limit": f"{self.memory_mb}MB",
                "enable_external_access": False,
                "autoload_known_extensions": False, "python_enable_replacements": False})
            self._db.execute(_SETUP)
        return self._db

    def close(self) -> None:
        """Drop the private database (the agent stops); a later resolve opens a new one."""
        if self._db is not None:
            self._db.close()
            self._db = None
            self._names_version = -1
            self._sv_waiting = False

    def resolve(self, fw: array, objs: list[Any], roots: list[Any], fcuda: list[Any],
                bw: array, bcuda: list[Any], recycle: Callable[[list[Any]], None],
                sv: array | None = None, sv_steps: list[int] | None = None,
                ) -> list[pa.Table]:
        """One flush -> at most one Arrow table of finished rows.

        ``fw``/``bw``: the taken forward records and backward events (whole passes only),
        ``objs``/``roots``: each forward record's object and root call, ``fcuda``/``bcuda``:
        the CUDA entries of the records flagged as having them, in order. ``sv``: saved-tensor
        records (saved_bytes.py, taken after ``fw``), ``sv_steps``: the steps they counted in.
        """
        n, m = len(fw) // FW_N, len(bw) // BW_N
        if not n and not m and not sv:  # nothing new for SQL: only rows waiting for CUDA events
            out, self._pending = self._pending, None
            return self._finish(out, recycle) if out is not None else []
        con = self._con()
        id0 = self._next_row
        if n:
            kinds = fw[FW_KIND::FW_N]
            opt = {id(o) for o, k in zip(objs, kinds) if k == OPT_STEP} if OPT_STEP in kinds \
                else set()
            codes = self.names.codes(objs, roots, opt)
            con.register("new_rows", pa.table({
                "i": pa.array(range(n), pa.int64()), "r": records(fw, FW_N),
                "code": pa.array(codes, pa.int32())}))
            c0 = _CUDA_INDEX.format(FW_CUDA + 1, self._next_fc, FW_CUDA + 1) if fcuda \
                else "NULL::BIGINT"
            con.execute(_INSERT.format(id0=id0, c0=c0))
            if RECOMPUTE in kinds:
                con.execute(_RECOMPUTE_DEPTH.format(id0=id0, forward=FORWARD,
                                                    recompute=RECOMPUTE))
            con.unregister("new_rows")
            self._next_row += n
            self._fev.update(zip(range(self._next_fc, self._next_fc + len(fcuda)), fcuda))
            self._next_fc += len(fcuda)
        self._saved(con, sv, sv_steps)
        if self.names.version != self._names_version:
            con.register("names", self.names.table())
            self._names_version = self.names.version
        con.register("new_events", pa.table({"i": pa.array(range(m), pa.int64()),
                                             "r": records(bw, BW_N)}) if m else _EMPTY)
        self._bev.update(zip(range(self._next_bc, self._next_bc + len(bcuda)), bcuda))
        b0 = _CUDA_INDEX.format(BW_CUDA + 1, self._next_bc, BW_CUDA + 1) if bcuda \
            else "NULL::BIGINT"
        out = con.sql(_OUTPUT.format(id0=id0, b0=b0, off=self._offset_ns, near=_NEAR,
                                     rank=int(self.rank), **_KINDS)).to_arrow_table()
        con.unregister("new_events")
        self._next_bc += len(bcuda)
        con.execute(_PRUNE)
        if self._pending is not None:
            out = pa.concat_tables([self._pending, out])
            self._pending = None
        return self._finish(out, recycle)

    def _saved(self, con: duckdb.DuckDBPyConnection, sv: array | None,
               sv_steps: list[int] | None) -> None:
        """Own saved bytes of this flush's forward calls into ``owned`` (``_OWN_SAVED``).
        Every statement's result is fetched: the connection refuses a register() while one
        is open."""
        if sv_steps:
            con.execute("INSERT INTO sv_steps SELECT unnest($1::BIGINT[])", [sv_steps]).fetchall()
            con.execute("DELETE FROM sv_steps "
                        "WHERE step < (SELECT max(step) FROM sv_steps) - 64").fetchall()
        if sv:
            con.register("new_sv", pa.table({"r": records(sv, SV_N)}))
            con.execute("INSERT INTO sv SELECT r[1], r[2], r[3] FROM new_sv").fetchall()
            con.unregister("new_sv")
            self._sv_waiting = True
        if self._sv_waiting:
            sql = _OWN_SAVED.format(opt_step=OPT_STEP, saved=SAVED, input=INPUT)
            for stmt in sql.split(";"):
                if stmt.strip():
                    con.execute(stmt).fetchall()
            self._sv_waiting = bool(con.execute("SELECT count(*) FROM sv").fetchall()[0][0])
        else:
            con.execute("DELETE FROM owned").fetchall()

    def _finish(self, out: pa.Table, recycle: Callable[[list[Any]], None]) -> list[pa.Table]:
        if out.column("c0").null_count < out.num_rows:
            out = self._cuda(out, recycle)
        else:
            self._fev.clear()
            self._bev.clear()
        if not out.num_rows:
            return []
        return [out.select(self.schema.names).cast(self.schema)]

    def _cuda(self, out: pa.Table, recycle: Callable[[list[Any]], None]) -> pa.Table:
        """Rows with CUDA events take the GPU duration and the allocator's numbers once their
        end event completed; the others wait in ``_pending`` for the next flush."""
        c0s, c1s = out.column("c0").to_pylist(), out.column("c1").to_pylist()
        kinds = out.column("kind").to_pylist()
        n = out.num_rows
        gpu: list[float | None] = [None] * n
        mems: list[Any] = [None] * n
        ready = [True] * n
        done_events: list[Any] = []
        for i in range(n):
            a = c0s[i]
            if a is None:
                continue
            if kinds[i] == BACKWARD:
                ev0, mem = self._bev.get(a, (None, None))
                ev1 = self._bev.get(c1s[i], (None,))[0] if c1s[i] is not None else None
            else:
                ev0, ev1, mem = self._fev.get(a, (None, None, None))
            mems[i] = mem
            if ev0 is None or ev1 is None:
                continue  # no event pair (stream capture): host time
            if not ev1.query():
                ready[i] = False
                continue
            gpu[i] = ev0.elapsed_time(ev1) / 1e3
            if kinds[i] != BACKWARD:  # backward events may also end other spans
                done_events += [ev0, ev1]
        if done_events:
            recycle(done_events)
        keep = pa.array(ready, pa.bool_())
        if not all(ready):
            waiting = out.filter(pc.invert(keep))
            self._pending = waiting.slice(max(0, waiting.num_rows - _MAX_PENDING))
            fev, bev = {}, {}
            for a, b, k in zip(*(waiting.column(c).to_pylist() for c in ("c0", "c1", "kind"))):
                if k != BACKWARD:
                    if a in self._fev:
                        fev[a] = self._fev[a]
                    continue
                for c in (a, b):
                    if c in self._bev:
                        bev[c] = self._bev[c]
            self._fev, self._bev = fev, bev
        else:
            self._fev.clear()
            self._bev.clear()
        gpu_a = pa.array(gpu, pa.float64())
        cols = {"duration": pc.coalesce(gpu_a, out.column("cpu_duration")),
                "device": pc.if_else(pc.is_valid(gpu_a), _CUDA, _CPU)}
        zeros = (0.0, 0.0, 0.0, 0.0)
        mem_rows = [m or zeros for m in mems]
        for j, name in enumerate(_MEM_COLS):
            cols[name] = pa.array([m[j] for m in mem_rows], pa.float64())
        for name, col in cols.items():
            out = out.set_column(out.schema.get_field_index(name), name, col)
        return out.filter(keep)
