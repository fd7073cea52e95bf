"""The FSDP2 agreement's start gate (collectors/sharded_start.py) on a real c10d TCPStore, one
client connection per rank, each rank stepping a real Adam: ranks whose optimizer hook came in
place at different steps start agreeing at one step, no poll ever waits for another rank, and
every "off" is the same answer on every rank."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from probe_agent.actions.agreement import STORE_PREFIX, StepAgreement  # noqa: E402
from probe_agent.collectors.sharded_start import MARGIN, StartGate  # noqa: E402


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield server


def _gate(server, rank: int, pending_s: float = 60.0) -> StartGate:
    a = StepAgreement()
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False)
    a._store = dist.PrefixStore(STORE_PREFIX, client)  # as store() builds it in a job
    return StartGate(rank, 2, a, key="numerics-sharded.0", pending_s=pending_s)


class Rank:
    """A rank's optimizer, stepped for real: at its pre-hook of step N, Adam's count is N-1."""

    def __init__(self, kind: str = "adam") -> None:
        self.p = torch.nn.Parameter(torch.zeros(2))
        self.opt = (torch.optim.Adam([self.p]) if kind == "adam"
                    else torch.optim.SGD([self.p], lr=0.1, momentum=0.9))
        self.step = 1

    def next(self) -> None:
        self.p.grad = torch.ones(2)
        self.opt.step()
        self.step += 1

    def until(self, step: int) -> None:
        while self.step < step:
            self.next()


def test_a_rank_whose_hook_comes_steps_later_starts_agreeing_at_the_same_step(store):
    r0, r1 = Rank(), Rank()
    g0, g1 = _gate(store, 0), _gate(store, 1)
    # GIVEN rank 0's hook in place from step 1 (no Adam state yet: it announces at step 2)
    # and rank 1's only from step 5
    seen0 = {}
    for step in range(1, 6):
        r0.until(step)
        seen0[step] = g0.poll(r0.opt)  # never a wait on rank 1: undecided, step after step
    assert set(seen0.values()) == {None} and g0.announced == 2, (seen0, g0.state())
    # WHEN rank 1 announces at its first hooked step (5): every rank is in
    r1.until(5)
    assert g1.poll(r1.opt) is None
    # THEN both start at S = 5 + MARGIN, neither before: rank 0 reads the decision at its
    # next step, before S
    start = 5 + MARGIN
    assert g1.start == start, g1.state()
    for step in range(6, start + 2):
        r0.until(step)
        r1.until(step)
        assert g0.poll(r0.opt) is g1.poll(r1.opt) is (True if step >= start else None), step
    assert g0.start == start and g0.why is None and g1.why is None


def test_a_rank_that_never_takes_part_turns_every_rank_off_the_same_way(store):
    r0, r1 = Rank(), Rank()
    r0.until(3)
    g0 = _gate(store, 0, pending_s=0.0)
    # GIVEN rank 0 alone (the agent on some ranks only), past its wait (0 s): off, not raised
    assert g0.poll(r0.opt) is False and "only 1 of 2 ranks took part" in g0.why, g0.state()
    # THEN a rank that comes later reads the same "off": it never starts agreeing alone
    r1.until(9)
    g1 = _gate(store, 1)
    assert g1.poll(r1.opt) is False and g1.why == g0.why


def test_an_optimizer_without_a_step_count_is_off_on_every_rank(store):
    # GIVEN SGD with momentum (state, but no step count: each agent would count its own)
    r0 = Rank("sgd")
    r0.until(2)
    g0 = _gate(store, 0)
    assert g0.poll(r0.opt) is False and "keeps no step count" in g0.why, g0.state()
    r1 = Rank()
    r1.until(4)
    g1 = _gate(store, 1)
    assert g1.poll(r1.opt) is False and g1.why == g0.why


def test_arrivals_no_rank_made_turn_it_off(store):
    # GIVEN someone else added arrivals under the gate's key
    store.add(f"{STORE_PREFIX}/numerics-sharded.0/ready", 5)
    r0 = Rank()
    r0.until(2)
    g0 = _gate(store, 0)
    # THEN a rank's announcement finds 6 for a job of 2: off, saying why
    assert g0.poll(r0.opt) is False and "written by someone else" in g0.why, g0.state()


def test_a_rank_that_stops_before_the_start_withdraws_every_rank(store):
    r0, r1 = Rank(), Rank()
    r0.until(2)
    g0, g1 = _gate(store, 0), _gate(store, 1)
    assert g0.poll(r0.opt) is None
    # WHEN rank 0's recorder stops while rank 1 has not announced yet
    assert g0.withdraw() is True and g0.start is None
    # THEN rank 1 reads "off" when it comes, never "go" (it would agree alone)
    r1.until(3)
    assert g1.poll(r1.opt) is False and "stopped before the agreement began" in g1.why


def test_a_rank_that_stops_after_go_keeps_the_agreed_start(store):
    r0, r1 = Rank(), Rank()
    r0.until(2)
    r1.until(2)
    g0, g1 = _gate(store, 0), _gate(store, 1)
    assert g0.poll(r0.opt) is None and g1.poll(r1.opt) is None  # go:4 written
    # WHEN rank 0 stops now: the others will agree at 4, so it must take part there to leave
    assert g0.withdraw() is True and g0.start == g1.start == 2 + MARGIN
