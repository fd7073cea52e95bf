"""probe_cli rendering: pure functions from RankResults to text (stdlib only, no server)."""

from __future__ import annotations

import json

import pytest

from probe_cli.errors import AgentHTTPError, AgentTimeoutError
from probe_cli.group import compact_ranges, group_by, outliers_first, rank_label
from probe_cli.render.stacks import render_backtrace, source_note, stack_key
from probe_cli.render.text import (
    format_cell,
    format_duration,
    format_table,
    paint,
    query_notes,
    rank_header,
    render_eval,
    render_eval_failures,
    render_info,
    render_json,
    render_query_csv,
    render_query_table,
)
from probe_cli.result import RankResult


def ok(rank: int, **data: object) -> RankResult:
    return RankResult(rank, f"http://10.0.0.{rank}:9700", True, {"ok": True, "rank": rank, **data},
                      host="node0", pid=1000 + rank)


def frames(*funcs: str) -> list[dict]:
    return [{"depth": i, "func": f, "file": "train.py", "lineno": 10 * (i + 1),
             "frame_type": "Python", "locals": None} for i, f in enumerate(funcs)]


def bt(rank: int, *funcs: str, **extra: object) -> RankResult:
    thread = {"thread_id": 7, "thread_name": "MainThread", "is_main": True, "is_agent": False,
              "frames": frames(*funcs)}
    return ok(rank, **{"source": "in-process", **extra}, threads=[thread])


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([], ""),
        ([3], "3"),
        ([0, 1], "0,1"),
        ([0, 1, 2], "0–2"),
        ([0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15], "0–6,8–15"),
        ([8, 0, 2, 1, 2], "0–2,8"),
        ([1, 3, 5, 6], "1,3,5,6"),
    ],
    ids=["empty", "one", "pair", "run", "two-runs", "unsorted-dupes", "gaps"],
)
def test_compact_ranges(ranks, text):
    assert compact_ranges(ranks) == text


def test_rank_label_singular_plural_and_unknown():
    assert rank_label([7]) == "rank 7"
    assert rank_label([0, 1, 2, 4]) == "ranks 0–2,4"
    assert rank_label([None]) == "rank ?"
    assert rank_label([1, None]) == "ranks 1,?"


def test_outliers_first_orders_by_size_then_lowest_rank():
    # GIVEN ranks 0-5 with two stacks: {0,1,2,4,5} and {3}, plus a tie between {6} and {7}
    items = [(r, "a") for r in (0, 1, 2, 4, 5)] + [(3, "b"), (7, "d"), (6, "c")]
    # WHEN grouped and ordered
    groups = outliers_first(group_by(items, lambda x: x[1]), lambda x: x[0])
    # THEN singletons come first, by lowest rank; the big class last
    assert [g.key for g in groups] == ["b", "c", "d", "a"]


def test_format_table_aligns_numbers_right_and_shows_null():
    lines = format_table(["name", "n"], [["fc1", 12], ["layers.3.attn", None]])
    assert lines[0] == "name" + " " * 14 + "n"
    assert lines[1] == "-------------  ----"
    assert lines[2] == "fc1              12"
    assert lines[3] == "layers.3.attn  NULL"


def test_format_cell_flattens_newlines_and_cuts_long_text():
    assert format_cell("a\nb") == "a\\nb"
    assert format_cell(float("nan")) == "nan"
    long = format_cell("x" * 500)
    assert len(long) == 120 and long.endswith("…")


def test_paint_only_with_colour():
    assert paint("hi", "bold", False) == "hi"
    assert paint("hi", "bold red", True) == "\x1b[1;31mhi\x1b[0m"


def test_rank_header_has_py_spy_shape():
    assert rank_header(ok(1)) == "Rank 1 (node0:1001) http://10.0.0.1:9700"


def test_render_json_is_one_array_sorted_wire_bodies_with_synthesised_failures():
    # GIVEN one ok rank, one rank with an HTTP error body and one silent rank
    body = {"ok": False, "rank": 1, "status": 401, "error": "wrong token"}
    err = AgentHTTPError("x", url="u", reason="HTTP 401", status=401, body=body)
    silent = AgentTimeoutError("agent at u did not answer within 5 s", url="u", reason="timeout")
    results = [ok(0, result="2"), RankResult(1, "u", False, body, err),
               RankResult(2, "u", False, None, silent)]
    # WHEN rendered as JSON
    parsed = json.loads(render_json(results))
    # THEN it is one array of wire bodies in rank order, failures included
    assert [b["rank"] for b in parsed] == [0, 1, 2]
    assert parsed[0] == {"ok": True, "rank": 0, "result": "2"}
    assert parsed[1] == body
    assert parsed[2]["ok"] is False and "did not answer" in parsed[2]["error"]


def test_query_across_ranks_is_one_table_with_rank_column():
    results = [ok(r, columns=["module", "n"], rows=[["fc1", r * 10]]) for r in range(2)]
    lines = render_query_table(results)
    assert lines[0].split() == ["rank", "module", "n"]
    assert lines[2].split() == ["0", "fc1", "0"]
    assert lines[3].split() == ["1", "fc1", "10"]


def test_query_single_rank_has_no_rank_column():
    lines = render_query_table([ok(0, columns=["a"], rows=[[1]])])
    assert lines[0] == "a"


def test_query_with_different_columns_per_rank_gets_a_table_per_rank():
    results = [ok(0, columns=["a"], rows=[[1]]), ok(1, columns=["b"], rows=[[2]])]
    lines = render_query_table(results)
    assert lines[0].startswith("Rank 0 ") and "Rank 1 (node0:1001) http://10.0.0.1:9700" in lines


def test_query_csv_has_rank_column_and_quotes():
    results = [ok(r, columns=["a", "b"], rows=[[r, "x,y"]]) for r in range(2)]
    assert render_query_csv(results) == ["rank,a,b", '0,0,"x,y"', '1,1,"x,y"']


def test_eval_groups_identical_outputs():
    # GIVEN 16 ranks where rank 7 gives a different answer
    results = [ok(r, result="1e-4" if r != 7 else "nan", stdout="") for r in range(16)]
    # WHEN rendered
    lines = render_eval(results)
    # THEN the majority is one group in compact form, rank 7 its own
    assert lines == ["ranks 0–6,8–15:", "1e-4", "rank 7:", "nan"]


def test_eval_single_rank_prints_bare_output():
    assert render_eval([ok(0, result="3", stdout="hi\n")]) == ["hi", "3"]
    assert render_eval([ok(0, result=None, stdout="")]) == []


def test_eval_failures_show_grouped_tracebacks():
    tb = "Traceback (most recent call last):\nZeroDivisionError: division by zero\n"
    body = {"ok": False, "status": 400, "error": "ZeroDivisionError", "traceback": tb,
            "stdout": "before\n"}
    results = [RankResult(r, "u", False, {**body, "rank": r}) for r in (1, 2, 3)]
    assert render_eval_failures(results) == [
        "ranks 1–3:", "before", "Traceback (most recent call last):",
        "ZeroDivisionError: division by zero",
    ]
    assert render_eval_failures(results[:1], labels=False)[0] == "before"


def test_backtrace_groups_main_stacks_outliers_first():
    # GIVEN 8 ranks in all_reduce and rank 3 in the DataLoader
    results = [bt(r, "all_reduce", "train") if r != 3 else bt(r, "__next__", "train")
               for r in range(8)]
    # WHEN rendered without --all
    lines = render_backtrace(results)
    # THEN the outlier comes first, frames innermost first in py-spy's shape
    assert lines[0] == "rank 3 (1/8 ranks) main thread:"
    assert lines[1] == "    __next__ (train.py:10)"
    assert lines[2] == "    train (train.py:20)"
    assert lines[4] == "ranks 0–2,4–7 (7/8 ranks) main thread:"
    assert lines[5] == "    all_reduce (train.py:10)"


def test_backtrace_single_rank_prints_every_thread_with_locals():
    r = bt(0, "step")
    r.data["threads"][0]["frames"][0]["locals"] = {"lr": "0.001"}
    lines = render_backtrace([r], show_locals=True)
    assert lines == [
        "Rank 0 (node0:1000) http://10.0.0.0:9700",
        "Thread 7 (MainThread) [main]",
        "    step (train.py:10)",
        "        lr = 0.001",
    ]


def test_backtrace_shows_out_of_process_source_and_gil_holder():
    # GIVEN a body from the out-of-process reader (fields may be absent on older agents)
    r = bt(0, "matmul", source="out-of-process", route="py-spy", gil_holder=7)
    # WHEN rendered in full
    lines = render_backtrace([r])
    # THEN the header says where the stack came from, and the thread holding the GIL is tagged
    assert lines[0].endswith("[out-of-process via py-spy; GIL held by thread 7]")
    assert lines[1] == "Thread 7 (MainThread) [main] [gil]"
    assert source_note({"source": "in-process"}) == "" and source_note({}) == ""


def test_stack_key_ignores_thread_ids_and_locals():
    a, b = bt(0, "f", "g"), bt(1, "f", "g")
    b.data["threads"][0]["thread_id"] = 99
    assert stack_key(a.data) == stack_key(b.data)


def test_info_table_and_durations():
    access = {"mode": "same-user+token", "tcp": "on", "refused": 3}
    lines = render_info([ok(0, host="node0", pid=42, python="3.11.7", torch="2.13.0",
                            version="0.1.0", uptime_s=3725, access=access,
                            hot_path="native")])
    assert lines[0].split() == ["rank", "host", "pid", "python", "torch", "version", "access",
                                "hot_path", "uptime"]
    assert lines[2].split() == ["0", "node0", "42", "3.11.7", "2.13.0", "0.1.0",
                                "same-user+token,", "3", "refused", "native", "1h02m"]
    assert [format_duration(s) for s in (5, 65, 90000)] == ["5s", "1m05s", "1d01h"]


def test_query_that_selects_rank_gets_no_second_rank_column():
    results = [ok(r, columns=["rank", "n"], rows=[[r, 6]]) for r in range(2)]
    assert render_query_table(results)[0].split() == ["rank", "n"]
    assert render_query_csv(results) == ["rank,n", "0,6", "1,6"]


def test_query_notes_name_the_cap_that_cut_the_rows():
    bytes_cap = "PROBE_MAX_RESULT_BYTES (16777216 bytes)"
    results = [ok(0, columns=["x"], rows=[[1]], truncated=True, truncated_by=bytes_cap),
               ok(1, columns=["x"], rows=[[1]], truncated=True),
               ok(2, columns=["x"], rows=[[1]], truncated=False)]
    notes = query_notes(results)
    assert notes == [
        f"note: rank 0: result truncated at {bytes_cap}; add a LIMIT or aggregate, or raise "
        "PROBE_MAX_RESULT_BYTES on the training side",
        "note: rank 1: result truncated at the agent's row cap; add a LIMIT or aggregate, or "
        "raise PROBE_MAX_ROWS on the training side",
    ]


def test_a_sharded_checkpoint_says_how_to_load_its_directory():
    from probe_cli.render.actions import render_checkpoint

    data = {"mode": "torch.distributed.checkpoint", "step": 7, "directory": "/ck/d",
            "files": [{"path": "/ck/d/.metadata", "bytes": 10}], "names": {}}
    results = [RankResult(rank=0, url="u", ok=True, data={"rank": 0, "state": "ok", "data": data})]
    out = "\n".join(render_checkpoint(results))
    assert "torch.distributed.checkpoint.load(state, checkpoint_id='/ck/d')" in out, out
    assert "format_utils dcp_to_torch /ck/d OUT.pt" in out, out
    # a torch.save checkpoint (one file) needs no such line
    data = {**data, "mode": "torch.save", "directory": None}
    results = [RankResult(rank=0, url="u", ok=True, data={"rank": 0, "state": "ok", "data": data})]
    assert "dcp_to_torch" not in "\n".join(render_checkpoint(results))
