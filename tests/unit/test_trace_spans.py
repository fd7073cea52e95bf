"""The resolver's backward spans, from hand-made records (no training, no hot path): a call's
backward ends when autograd reaches its input's node, or at the next start of a call disjoint
from it, whichever comes first (docs/decisions/tracer.md, "Backward spans"). The hot paths that
record these numbers are tested on real models in tests/integration/tracing/."""

from __future__ import annotations

from array import array

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")
nn = pytest.importorskip("torch.nn")

from probe_agent.collectors.tracer.trace_columns import FORWARD, PASS_END  # noqa: E402
from probe_agent.collectors.tracer.trace_rows import RowResolver  # noqa: E402
from tests.support import ddl_schemas  # noqa: E402

US = 1000  # ns


class Attn(nn.Module):
    """Names only: c_attn and c_proj around the parent's own core."""

    def __init__(self) -> None:
        super().__init__()
        self.c_attn, self.c_proj, self.drop = nn.Identity(), nn.Identity(), nn.Identity()


def backward_spans(rows: list[tuple[int, int, int, int, int]], objs: list, root: object,
                   events: list[tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """rows: (t0, t1, depth, output node, input node); events: (t, node); times in us ->
    {module: (start, end)} of the backward rows in us from the first backward start (the
    rows' timestamps are seconds since the epoch: a double resolves ~0.24 us there)."""
    fw = array("q")
    for t0, t1, depth, gseq, igseq in rows:
        fw.extend((t0 * US, t1 * US, 1, FORWARD, depth, gseq, 0, igseq))
    bw = array("q")
    for t, gseq in events:
        bw.extend((t * US, gseq, 0))
    resolver = RowResolver(0, ddl_schemas()["python.torch_trace"])
    tables = resolver.resolve(fw, objs, [root] * len(objs), [], bw, [], lambda evs: None)
    out = [r for t in tables for r in t.to_pylist() if r["stage"] == "backward"]
    t_root = min(r["timestamp"] for r in out)
    return {r["module"]: (round((r["timestamp"] - t_root) * 1e6),
                          round((r["timestamp"] - t_root + r["cpu_duration"]) * 1e6))
            for r in out}


def test_a_childs_span_ends_at_its_inputs_node_and_the_gap_is_the_parents():
    # GIVEN attn (output node 13, input node 9) around c_attn (output 11, input 9), its own
    # core, c_proj (input 12, output 13: shared with attn) and an identity dropout (in = out)
    m = Attn()
    rows = [(10, 20, 1, 11, 9), (30, 40, 1, 13, 12), (41, 42, 1, 13, 13), (5, 50, 0, 13, 9)]
    objs = [m.c_attn, m.c_proj, m.drop, m]
    # WHEN backward reaches attn's output (1000), c_proj's input (1010: c_proj is done), then
    # c_attn's output after the core (1050), attn's input (1060), and the pass ends (1070)
    got = backward_spans(rows, objs, m, [(1000, 13), (1010, 12), (1050, 11), (1060, 9),
                                         (1070, PASS_END)])
    # THEN c_proj's backward is 1000-1010 (before: until c_attn's start, 1050), the core
    # (1010-1050) is in attn's span and in no child's, c_attn ends at its input's node
    assert got["c_proj"] == (0, 10), got
    assert got["c_attn"] == (50, 60), got
    assert got["Attn"] == (0, 60), got
    # AND an identity module (its input's node is its output's) has no backward time
    assert got["drop"] == (0, 0), got


def test_an_input_node_reached_before_the_call_or_absent_leaves_the_old_end():
    # GIVEN c_attn whose input node (7) autograd reaches before c_attn's own start, and c_proj
    # whose input has no grad_fn (-1)
    m = Attn()
    rows = [(10, 20, 1, 11, 7), (30, 40, 1, 13, -1), (5, 50, 0, 14, -1)]
    objs = [m.c_attn, m.c_proj, m]
    got = backward_spans(rows, objs, m, [(1000, 14), (1005, 13), (1008, 7), (1050, 11),
                                         (1070, PASS_END)])
    # THEN each ends at the next start of a call disjoint from it, or at the pass end
    assert got["c_proj"] == (5, 50), got
    assert got["c_attn"] == (50, 70), got
    assert got["Attn"] == (0, 70), got
