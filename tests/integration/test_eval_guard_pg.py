"""The immediate eval's collective guard at the process group (eval_trace.py): a collective
asked of the process group's own methods (``pg.allreduce([t]).wait()``), or by DDP's C++
reducer and buffer broadcast, is refused like ``dist.all_reduce``. Real torch and a real gloo
group (world size 1, so the calls would complete; the guard is told the job is multi-rank)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from probe_agent import eval_trace
from probe_agent.eval_trace import CollectiveInEvalError, EvalTrace

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def group(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    # the guard refuses only in a job of more than one rank: this one stands for one
    monkeypatch.setattr(eval_trace, "_world_size", lambda: 2)
    yield dist.group.WORLD
    dist.destroy_process_group()


def in_eval_thread(fn: Callable[[], object]) -> BaseException | None:
    """Run ``fn`` as an immediate eval's thread does: under EvalTrace, on its own thread."""
    out: list[BaseException | None] = [None]

    def run() -> None:
        trace = EvalTrace()
        trace.install()
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - the test reads what was raised
            out[0] = e
        finally:
            trace.remove()

    th = threading.Thread(target=run, name="probe-agent.eval")
    th.start()
    th.join(30)
    return out[0]


def test_process_group_methods_are_refused(group: Any) -> None:
    t = torch.ones(2)
    # WHEN an eval calls the process group's own method
    err = in_eval_thread(lambda: group.allreduce([t]).wait())
    # THEN it is refused before anything is sent, with the form to use instead
    assert isinstance(err, CollectiveInEvalError), err
    assert "allreduce" in str(err) and "probe eval --next-step" in str(err)
    assert t.tolist() == [1.0, 1.0]
    for call in (lambda: group.broadcast([t], 0).wait(), lambda: group.barrier().wait()):
        assert isinstance(in_eval_thread(call), CollectiveInEvalError)
    # AND outside an eval the same call runs (the job's own threads are never traced)
    group.allreduce([t]).wait()


def test_ddp_reducer_and_buffer_broadcast_are_refused(group: Any) -> None:
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))
    x = torch.randn(8, 4)
    model(x).sum().backward()  # the job's own step: fine
    # WHEN an eval runs a forward through DDP (its buffers are broadcast first, in C++)
    err = in_eval_thread(lambda: model(x).sum().backward())
    # THEN it is refused
    assert isinstance(err, CollectiveInEvalError), err
    # AND the unwrapped module (no collective) still runs in an eval
    with torch.no_grad():
        assert in_eval_thread(lambda: model.module(x)) is None


def test_a_refusal_caught_by_the_eval_still_leaves_the_guard_on(group: Any) -> None:
    t = torch.ones(1)

    def twice() -> None:
        try:
            group.allreduce([t]).wait()
        except CollectiveInEvalError:
            pass
        group.allreduce([t]).wait()  # the guard must still be there

    assert isinstance(in_eval_thread(twice), CollectiveInEvalError)
