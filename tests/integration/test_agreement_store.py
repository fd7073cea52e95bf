"""The step agreement reads back what the job's c10d store holds, and c10d's TCPStore takes any
client that reaches its port: arrivals and decisions no rank wrote abort the action on every
rank, with a line saying so, instead of running it on a subset (a hang) or echoing 8 MiB."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from probe_agent.actions.agreement import STORE_PREFIX, StepAgreement  # noqa: E402


@pytest.fixture
def agreement():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    a = StepAgreement()
    a._store = dist.PrefixStore(STORE_PREFIX, store)  # the job's store, as store() builds it
    yield a, store


def _agree(a: StepAgreement, action_id: str) -> tuple[bool, str]:
    return a.agree(action_id, [0, 1], timeout_s=5.0, cancelled=lambda: False, step=7)


def test_two_ranks_that_arrive_agree_to_go(agreement):
    a, _ = agreement
    a._store.add("act1/arrived", 1)  # the other rank arrived first
    assert _agree(a, "act1") == (True, "")


def test_arrivals_beyond_the_group_abort(agreement):
    # GIVEN someone else added arrivals for an action of a 2-rank group
    a, raw = agreement
    raw.add(f"{STORE_PREFIX}/act2/arrived", 5)
    # WHEN a rank arrives
    run, why = _agree(a, "act2")
    # THEN it does not run, and says why
    assert not run and "6 arrivals counted for a group of 2" in why, why


def test_a_decision_no_rank_writes_aborts_and_is_not_echoed(agreement):
    # GIVEN 8 MiB planted as the decision before the ranks arrive
    a, raw = agreement
    raw.set(f"{STORE_PREFIX}/act3/decision", b"x" * (8 << 20))
    a._store.add("act3/arrived", 1)
    # WHEN a rank arrives (every rank arrived: it votes go, and reads the planted value back)
    run, why = _agree(a, "act3")
    # THEN the action is skipped with one short line
    assert not run and "not written by a rank" in why and len(why) < 200, why[:300]


def test_a_rank_written_abort_is_followed(agreement):
    a, raw = agreement
    raw.set(f"{STORE_PREFIX}/act4/decision", "abort:cancelled while 1 of 2 ranks had reached")
    run, why = _agree(a, "act4")
    assert not run and why == "skipped on every rank: cancelled while 1 of 2 ranks had reached"
