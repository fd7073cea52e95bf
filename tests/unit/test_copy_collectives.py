"""A dead rank's collectives brought up to its end (transport/copy_collectives.py, pure): the black
box's calls, the end record's last rows, and the last collective marked by a collective
exception (gloo's recorder calls a timed-out all-reduce completed)."""

from __future__ import annotations

from probe_cli.transport.copy_collectives import mark_end, merge_end_rows, merge_strip


def row(seq, state="done", start=None, source="flight_recorder", shapes="[[577]]"):
    return {"pg": "0", "seq": seq, "op": "all_reduce", "state": state, "is_p2p": False,
            "start_time": 100.0 + seq if start is None else start, "end_time": None,
            "shapes": shapes, "callsite": "/j/t.py:152 main", "source": source,
            "group_ranks": [0, 1], "error": None}


def test_the_strip_adds_the_call_the_copy_lacks_and_overrides_a_stale_state():
    copied = [row(18), row(19, state="pending")]
    strip = [{"n": 7, "pg": "0", "seq": 19, "op": "all_reduce", "shapes": "[[]]",
              "dtype": "float32", "start_time": 119.0, "end_time": 119.5, "state": "done",
              "error": None, "thread_name": "MainThread", "callsite": "/j/t.py:75 log_metric"},
             {"n": 8, "pg": "0", "seq": 20, "op": "all_reduce", "shapes": "[[1]]",
              "dtype": "float32", "start_time": 120.0, "end_time": None, "state": "pending",
              "error": None, "thread_name": "MainThread", "callsite": "/j/t.py:75 log_metric"}]
    out = merge_strip(copied, strip)
    assert [(r["seq"], r["state"]) for r in out] == [(18, "done"), (19, "done"), (20, "pending")]
    assert out[2]["source"] == "strip" and out[2]["group_ranks"] == [0, 1]
    assert out[1]["callsite"].endswith("log_metric") and out[1]["source"] == "both"


def test_end_rows_are_fresher_than_the_table_copy():
    copied = [row(15), row(16, state="pending")]
    end = {"kind": "signal", "collectives": [row(16), row(46, state="pending")]}
    out = merge_end_rows(copied, end)
    assert [(r["seq"], r["state"]) for r in out] == [(15, "done"), (16, "done"), (46, "pending")]


def test_a_collective_exception_marks_the_last_collective_failed():
    rows = [row(19), row(20)]  # gloo: the failed work reads completed
    end = {"kind": "exception", "at": 200.0,
           "exception": "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                        "waiting 15000ms for recv operation to complete"}
    out = mark_end(rows, end)
    assert out[1]["state"] == "failed" and "Timed out" in out[1]["error"]
    assert out[0]["state"] == "done"
    # an exception that is not a collective's leaves the rows alone
    assert mark_end(rows, {**end, "exception": "ValueError: loss went bad"}) == rows
