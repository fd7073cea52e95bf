"""The node route's wire format (probe_protocol/nodefan.py): merged once, split back exactly."""

from __future__ import annotations

import json

from probe_protocol import nodefan
from probe_protocol.tokens import sign_entry


def _bt(rank: int, where: str) -> dict:
    return {"ok": True, "rank": rank, "pid": 100 + rank, "source": "in-process",
            "threads": [{"thread_id": 7000 + rank, "thread_name": "MainThread", "is_main": True,
                         "frames": [{"depth": 0, "func": where, "lineno": 3}]}]}


def test_backtraces_send_each_distinct_stack_once_and_split_back_exactly():
    answers = [(r, 200, _bt(r, "fetch" if r == 3 else "all_reduce")) for r in range(8)]
    answers.append((8, 0, {"ok": False, "rank": 8, "status": 0, "error": "no such socket"}))
    merged = nodefan.merge("backtrace", {"rank": 0, "host": "n0"}, answers)
    assert len(merged["stacks"]) == 2
    back = nodefan.split(json.loads(json.dumps(merged)))
    assert back == answers
    assert [list(b) for _, _, b in back] == [list(b) for _, _, b in answers]  # key order too


def test_query_rows_carry_a_rank_column_and_split_back_exactly():
    def q(rank: int, rows: list, cols: list = ["module", "n"]) -> dict:  # noqa: B006
        return {"ok": True, "rank": rank, "columns": cols, "types": ["VARCHAR", "BIGINT"],
                "rows": rows, "truncated": False, "elapsed_ms": 1.0}

    answers = [(0, 200, q(0, [["fc1", 1], ["fc2", 2]])), (1, 200, q(1, [])),
               (2, 200, q(2, [["x", 1]], ["other", "n"])),  # other columns: kept in its body
               (3, 400, {"ok": False, "rank": 3, "status": 400, "error": "Parser Error"})]
    merged = nodefan.merge("query", {"rank": 0, "host": "n0"}, answers)
    assert merged["columns"] == ["rank", "module", "n"]
    assert merged["rows"] == [[0, "fc1", 1], [0, "fc2", 2]]
    back = nodefan.split(json.loads(json.dumps(merged)))
    assert back == answers
    assert [list(b) for _, _, b in back] == [list(b) for _, _, b in answers]


def test_only_signed_entries_on_this_host_are_relayed_to():
    token = "t"
    entries = [sign_entry(token, {"rank": 0, "url": None, "host": "a", "pid": 10}),
               sign_entry(token, {"rank": 1, "url": None, "host": "b", "pid": 11}),
               {"rank": 2, "url": None, "host": "a", "pid": 12},  # unsigned: forged?
               {**sign_entry(token, {"rank": 3, "url": None, "host": "a", "pid": 13}),
                "pid": 1}]  # pid changed after signing
    assert nodefan.local_ranks(entries, "a", token) == {0: 10}
    assert nodefan.local_ranks(entries, "a", None) == {0: 10, 2: 12, 3: 1}


def test_a_node_request_carries_read_routes_only():
    assert nodefan.read_request({"route": "eval", "params": {}, "ranks": [0]}).startswith(
        "route must be one of")
    assert isinstance(nodefan.read_request({"route": "query", "params": {}, "ranks": []}), str)
    assert isinstance(nodefan.read_request({"route": "query", "ranks": [True]}), str)
    assert nodefan.read_request(nodefan.request("query", {"sql": "x"}, [2, 1, 2])) == (
        "query", {"sql": "x"}, [1, 2])
