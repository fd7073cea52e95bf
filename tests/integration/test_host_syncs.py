"""Host syncs counted per step with their call sites (probe_agent/collectors/host_syncs.py),
on a real agent in this process: exact counts and lines on a loop with a known number of
calls, nothing from other threads or from the agent, the originals back after stop, and no
graph break or recompile added under torch.compile."""

from __future__ import annotations

import inspect
import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

HERE = __file__


def _rows(agent: Any, sql: str) -> list[tuple[Any, ...]]:
    agent.store.flush()
    return [tuple(r) for r in agent.store.query(sql).rows]


def _line(marker: str) -> int:
    """The line of this file that holds ``marker`` (in a comment at the call)."""
    src = inspect.getsource(_loop).splitlines()
    first = inspect.getsourcelines(_loop)[1]
    return first + next(i for i, t in enumerate(src) if marker in t)


def _loop(steps: int, items: int) -> None:
    model = nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        for _ in range(items):
            loss.item()  # SITE-ITEM
        loss.tolist()  # SITE-TOLIST
        torch.nonzero(model.weight > 0)  # SITE-NONZERO
        torch.where(model.weight > 0, 1.0, 0.0)  # three arguments: no sync
        f"{loss:.3f}"  # SITE-FORMAT
        model.weight.detach().cpu()  # SITE-CPU


def test_counts_and_sites_exact(make_agent):
    # GIVEN an agent and a loop with known syncs per step
    agent = make_agent(trace="off")
    _loop(6, items=7)
    # THEN from the second step on every step holds exactly those calls at their lines
    rows = _rows(agent, "SELECT step, kind, file, line, func, calls FROM python.host_syncs "
                        "ORDER BY step, kind")
    by_step: dict[int, dict[tuple[str, int], int]] = {}
    for step, kind, file, line, func, calls in rows:
        assert file == HERE and func == "_loop", (file, func)
        by_step.setdefault(step, {})[(kind, line)] = calls
    want = {("item", _line("SITE-ITEM")): 7, ("tolist", _line("SITE-TOLIST")): 1,
            ("data_shape", _line("SITE-NONZERO")): 1, ("print", _line("SITE-FORMAT")): 1,
            ("cpu", _line("SITE-CPU")): 1}
    # step 1 installs the counter; the calls after optimizer step N belong to step N + 1
    assert sorted(by_step) == [2, 3, 4, 5, 6], by_step
    for step in (3, 4, 5, 6):
        assert by_step[step] == want, (step, by_step[step])


def test_other_threads_and_stop(make_agent):
    agent = make_agent(trace="off")
    _loop(2, items=1)
    from probe_agent import patches

    assert patches.ours(torch.Tensor.__dict__["item"]) is not None
    done = threading.Event()

    def other() -> None:
        for _ in range(50):
            torch.ones(1).item()
        done.set()

    t = threading.Thread(target=other)
    t.start()
    t.join(30)
    assert done.is_set()
    _loop(2, items=0)
    rows = _rows(agent, "SELECT sum(calls) FROM python.host_syncs WHERE kind = 'item'")
    # the first loop's two calls (the one after its last step lands in the next step counted);
    # none of the other thread's 50
    assert rows[0][0] == 2, rows
    agent.stop()
    assert patches.ours(torch.Tensor.item) is None
    assert "__bool__" not in torch.Tensor.__dict__  # inherited again, as before


def test_no_recompile_or_graph_break_added(make_agent):
    import torch._dynamo
    from torch._dynamo.utils import counters

    def fn(x: Any) -> Any:
        y = torch.nonzero(x > 0)
        return y.sum() + torch.where(x > 0, x, 0.0).sum() + x[0].item() * 0

    def compiled_counts() -> dict[str, Any]:
        torch._dynamo.reset()
        counters.clear()
        f = torch.compile(fn, backend="eager")
        for x in (torch.ones(3), torch.ones(3), -torch.ones(3), torch.ones(2)):
            f(x)  # fixed data: dynamo specialises on .item()'s value and nonzero's size
        return {"frames": dict(counters["frames"]),
                "breaks": sum(counters["graph_break"].values())}

    plain = compiled_counts()
    agent = make_agent(trace="off")
    _loop(2, items=0)  # the counter is installed at the first step
    from probe_agent import patches

    assert patches.ours(torch.Tensor.item) is not None
    try:
        assert compiled_counts() == plain
    finally:
        torch._dynamo.reset()
        counters.clear()
        agent.stop()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: Any) -> Any:
        return torch.relu(self.fc(x))


def test_compile_state_recorded_without_recompiles(make_agent):
    """python.compile_state: an eager job says so; a compiled root and a compiled submodule are
    named, with torch's own graph-break and recompile counts, and reading them compiles
    nothing more than the job does."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch._dynamo.utils.clear_compilation_metrics()  # earlier tests' compilations
    try:
        agent = make_agent(trace="off")
        # (another compiled model alive in the process, not trained: not this job's root)
        teacher = torch.compile(nn.Linear(8, 8), backend="eager")
        model = nn.Sequential(Block(), nn.Linear(8, 1))
        model[0].compile(backend="eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step(n: int) -> None:
            model(torch.randn(n, 8)).sum().backward()
            opt.step()
            opt.zero_grad()

        for n in (4, 4, 4, 5, 6, 6, 6):
            step(n)
        frames = dict(counters["frames"])
        rows = _rows(agent, "SELECT step, dynamo, frames, recompiles, compiled_root, "
                            "compiled_modules FROM python.compile_state ORDER BY step")
        last = rows[-1]
        assert last[1] is True and last[2] == frames["total"], (rows, frames)
        assert last[3] == 1, rows  # batch 4 -> 5: one recompile (then dynamic)
        assert last[4] is False and last[5] == "0", rows
        for _ in range(3):
            step(6)
        assert dict(counters["frames"]) == frames  # the watcher compiled nothing
        del teacher
    finally:
        torch._dynamo.reset()
        counters.clear()


def test_torchs_own_cpu_tensors_are_no_sync(make_agent):
    """Adam reads each parameter's step count (a CPU tensor, on a GPU job too) with .item():
    not a sync, not counted; the same .item() in the job's code is."""
    agent = make_agent(trace="off")
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    for _ in range(4):
        loss = model(torch.randn(4, 8)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
    rows = _rows(agent, "SELECT kind, line, sum(calls) FROM python.host_syncs GROUP BY ALL")
    assert [(k, n) for k, _, n in rows] == [("item", 3)], rows  # steps 2-4: the loop's own


def _to_loop(steps: int) -> None:
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dev = torch.empty(3, device="meta")  # not on the CPU: a stand-in for a CUDA tensor
    cpu = torch.ones(3)
    for _ in range(steps):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        for target in ("cpu", torch.device("cpu"), cpu):
            with pytest.raises(NotImplementedError):  # a meta tensor has no data to copy
                dev.to(target)  # SITE-TO
        with pytest.raises(NotImplementedError):
            dev.to("cpu", non_blocking=True)  # asynchronous: no wait, not counted
        cpu.to("cpu")  # already on the CPU: not counted
        dev.to("meta")  # device to device: not counted
        dev.to(torch.float16)  # a cast: not counted


def test_to_cpu_is_patched_only_with_cuda_and_counts_device_to_host(make_agent):
    from probe_agent import patches
    from probe_agent.collectors import host_syncs

    # GIVEN an agent in a CPU-only process: Tensor.to (every batch move) is left alone
    agent = make_agent(trace="off")
    _to_loop(2)
    assert host_syncs._counter is not None and patches.ours(torch.Tensor.to) is None
    # WHEN the process has a CUDA context (forced: CI has no GPU), the stand-in goes in
    host_syncs._counter.install_to(torch)
    assert patches.ours(torch.Tensor.to) is not None
    _to_loop(4)
    # THEN each step counts exactly the 3 blocking device-to-host copies, at their line
    src, first = inspect.getsourcelines(_to_loop)
    line = first + next(i for i, t in enumerate(src) if "SITE-TO" in t)
    rows = _rows(agent, "SELECT step, kind, line, calls FROM python.host_syncs ORDER BY step")
    assert rows[-3:] == [(s, "cpu", line, 3) for s in (4, 5, 6)], rows
    # AND stop puts the original back
    agent.stop()
    assert patches.ours(torch.Tensor.to) is None and "to" not in torch.Tensor.__dict__
