"""probe_protocol's bodies as the CLI reads them (docs/http-api.md): tolerant of what an older
or newer agent leaves out. Pure; the bodies below are the documented examples. The contract test
(tests/integration/test_wire_contract.py) holds a real agent's bodies to the same classes."""

from __future__ import annotations

from probe_protocol.actions import ActionBody, StepBody
from probe_protocol.bodies import BacktraceBody, RanksBody
from probe_protocol.envelope import Envelope
from probe_protocol.query import QueryBody


def test_query_body_reads_the_datasette_shape():
    body = {"ok": True, "rank": 0, "columns": ["module", "n"], "types": ["VARCHAR", "BIGINT"],
            "rows": [["fc1", 12]], "truncated": False, "elapsed_ms": 3.1}
    q = QueryBody.from_wire(body)
    assert (q.rank, q.columns, q.types, q.rows) == (0, ("module", "n"), ("VARCHAR", "BIGINT"),
                                                    (["fc1", 12],))
    assert q.records() == [{"module": "fc1", "n": 12}] and not q.truncated


def test_error_body_envelope():
    env = Envelope.from_wire({"ok": False, "rank": 0, "status": 400,
                              "error": 'Parser Error: syntax error at or near "SELCT"'})
    assert (env.ok, env.rank, env.status) == (False, 0, 400)
    assert env.error.startswith("Parser Error")
    assert Envelope.from_wire(None).ok is None  # not a probe body: it said nothing


def test_missing_keys_read_as_empty_not_keyerror():
    """An older or newer agent still renders: what it leaves out is empty."""
    q = QueryBody.from_wire({"ok": True, "rank": 3})
    assert (q.columns, q.rows, q.truncated) == ((), (), False)
    bt = BacktraceBody.from_wire({"ok": True, "rank": 1, "threads": [{"is_main": False}, 7]})
    assert bt.threads == ({"is_main": False},) and bt.main_thread == {"is_main": False}


def test_ranks_body_keeps_ranks_and_drops_entries_without_one():
    r = RanksBody.from_wire({"ok": True, "rank": 0, "world_size": 2, "ranks": [
        {"rank": 0, "url": "http://h:9700", "host": "h", "pid": 1},
        {"rank": 1, "url": "", "host": "h", "pid": 2}, {"url": "http://x"}]})
    assert [e.rank for e in r.ranks] == [0, 1] and r.ranks[1].url is None
    assert r.entry(0).pid == 1 and r.entry(5) is None and r.world_size == 2


def test_action_refusal_carries_the_reason_and_the_clock():
    a = ActionBody.from_wire({"ok": False, "rank": 1, "status": 409, "reason": "past",
                              "current_step": 12, "error": "past"})
    assert (a.reason, a.action, a.state) == ("past", None, None)
    s = StepBody.from_wire({"ok": True, "rank": 1, "step": 9, "paused_at": 9})
    assert (s.step, s.paused_at) == (9, 9)
