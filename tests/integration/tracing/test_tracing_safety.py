"""Torch tracing never takes training down and stays bounded (issue 3): a raising hook, a
torch.compile'd model, byte retention, CUDA events (skipped without a GPU)."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("duckdb")

import torch.nn as nn  # noqa: E402

from tests.integration.tracing_support import TinyGPT, rows, train  # noqa: E402
from tests.support import wait_until  # noqa: E402


class BadDict(dict):
    """A model output the Python hot path cannot look into: its values() raises."""

    def values(self):  # type: ignore[override]
        raise RuntimeError("values() is broken on purpose")


class BadDim(torch.Tensor):
    """An input whose dim() raises: the tracer reads the batch size of every root call's input
    on both hot paths (the C++ one never calls a dict's values())."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.dim:
            raise RuntimeError("dim() is broken on purpose")
        return super().__torch_function__(func, types, args, kwargs or {})


class DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x):
        return BadDict(out=self.lin(x))


def test_a_raising_hook_is_counted_and_switches_tracing_off_not_training(make_agent, caplog,
                                                                          hot_path):
    agent = make_agent(trace="on")
    torch.manual_seed(0)
    model = DictOut()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4).as_subclass(BadDim), torch.randn(8, 1)
    losses = []
    # WHEN every forward makes the tracer fail
    for _ in range(15):
        loss = ((model(x)["out"] - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    # THEN training went on and learned, the failures were counted and logged once, and the
    # tracer switched itself off (the original nn.Module.__call__ is back)
    assert losses[-1] < losses[0]
    state = agent.collectors.tracer.state()
    assert state["disabled"] and state["failures"] >= 10, state
    assert "is broken on purpose" in state["last_error"]
    warned = [r for r in caplog.records if "module tracer failed" in r.getMessage()]
    assert len(warned) == 1
    from probe_agent.collectors.tracer import trace_hot

    assert torch.nn.Module.__call__ not in (trace_hot.traced_call, trace_hot.native_call)
    # rows of the calls that worked (the inner Linear) were still recorded before that
    assert rows(agent, "SELECT count(*) > 0 FROM torch_trace WHERE module = 'lin'") == [[True]]
    assert state["hot_path"] == "python"  # off now
    if hot_path == "native":
        assert agent.collectors.tracer.native.state()[2] is False  # no backward callback


# (This failed after any earlier test whose agent stopped while its FLOP meter measured a
# step: the meter's dispatch mode stayed on the thread, and dynamo compiled nothing under it.
# tests/integration/test_flop_meter_compile.py pins both halves.)
def test_a_compiled_model_trains_the_same_and_records_its_calls(make_agent):
    # GIVEN the same model trained eagerly without tracing ...
    torch.manual_seed(0)
    eager = train(TinyGPT(layers=1), 3)
    agent = make_agent(trace="every:2")
    torch.manual_seed(0)
    # WHEN it is compiled and trained with tracing toggling every other step
    compiled = torch.compile(TinyGPT(layers=1), backend="aot_eager")
    got = train(compiled, 3)
    # THEN it learns the same, and the traced steps have the compiled model's own rows (named
    # like the plain model) plus the optimizer step; nothing inside the compiled graph
    assert got == pytest.approx(eager, rel=1e-4)
    found = rows(agent, "SELECT DISTINCT step, module, stage FROM torch_trace "
                        "WHERE module <> 'GraphModule' AND module NOT LIKE 'compiled graph%' "
                        "ORDER BY ALL")
    assert found == [[2, "AdamW", "step"], [2, "TinyGPT", "backward"],
                     [2, "TinyGPT", "forward"]], found
    # (aot_eager runs the compiled FX graph as a GraphModule call, which is recorded too, named
    # by the modules it holds: 'compiled graph (wte, ...)'; inductor's compiled code is not a
    # module)
    assert agent.collectors.tracer.state()["failures"] == 0


def test_retention_holds_the_tables_under_the_byte_cap(make_agent):
    agent = make_agent(trace="on", retention_mb=1)
    model = TinyGPT(layers=1)
    train(model, 200)
    rows(agent, "SELECT 1")
    width = agent.store._step_tables["python.torch_trace"]

    def trimmed():
        # A read flushes the rows buffered since the last retention pass (passes run every
        # _RETENTION_EVERY_S), so the bound holds from the next pass on, not at every instant.
        n, lo, hi = rows(agent, "SELECT count(*), min(step), max(step) FROM torch_trace")[0]
        return (n, lo, hi) if lo > 1 and n * width <= 1 << 20 else None

    n, lo, hi = wait_until(trimmed, 15, "retention never brought torch_trace under the cap")
    assert hi == 200  # the newest steps stay
    assert agent.store.rows_dropped > 0


@pytest.mark.cuda
def test_cuda_rows_time_with_events_and_read_the_allocator(make_agent):
    agent = make_agent(trace="on")
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        model(torch.randn(64, 256, device="cuda")).sum().backward()
        opt.step()
    torch.cuda.synchronize()
    got = rows(agent, "SELECT device, min(duration) > 0, min(allocated) > 0, count(*) "
                      "FROM torch_trace WHERE step = 3 GROUP BY device")
    assert got == [["cuda", True, True, 9]]
    mem = rows(agent, "SELECT device, max(allocated) > 0 FROM memory GROUP BY device")
    assert mem == [["cuda:0", True]]


def test_a_stopped_agent_leaves_torch_as_it_found_it_and_is_freed(make_agent):
    import gc
    import weakref

    from torch.nn.utils import clip_grad
    from torch.utils.data import dataloader

    import probe_agent

    next_before = dataloader._BaseDataLoaderIter.__dict__["__next__"]
    clip_before = clip_grad._clip_grads_with_norm_
    call_before = nn.Module.__call__
    function_dict_before = dict(torch.autograd.Function.__dict__)
    from probe_agent import patches

    # (earlier agents' excepthooks that torch.distributed's init_process_group wrapped since
    # stay under its wrapper, listed: not this agent's to restore)
    left_before = set(patches.active())
    # GIVEN an agent that traced a loop with a DataLoader and gradient clipping
    agent = make_agent(trace="on")
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(32, 4), batch_size=8)
    # (the agent is bound as a default, not a closure: the name is deleted below to see it freed)
    wait_until(lambda a=agent: a.collectors.trainloop.state()["dataloader_wrapped"], 10,
               "the DataLoader was never wrapped")
    for x in loader:
        model(x).sum().backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    # (the patch ledger lists what it replaced, for `probe info`)
    listed = {p["target"] for p in agent.info().patches}
    assert {"torch.nn.modules.module.Module.__call__",
            "torch.utils.data.dataloader._BaseDataLoaderIter.__next__",
            "torch.nn.utils.clip_grad._clip_grads_with_norm_"} <= listed, listed
    ref = weakref.ref(agent)
    # WHEN it stops (its writer's last flush runs after the collectors stopped)
    probe_agent.stop()
    report = agent.stop_report
    del agent
    # THEN the wrapped functions are the originals again, no hook is left on the model, and
    # nothing keeps the agent (and its DuckDB) alive
    assert dataloader._BaseDataLoaderIter.__dict__["__next__"] is next_before
    assert clip_grad._clip_grads_with_norm_ is clip_before
    assert nn.Module.__call__ is call_before
    assert dict(torch.autograd.Function.__dict__) == function_dict_before
    # AND the ledger holds nothing restorable of this agent's; what stays for the process says why
    assert not [p.target for p in patches.active() if p.restorable and p not in left_before]
    assert report is not None and all(k["why"] for k in report["kept"]), report
    from probe_agent.collectors.tracer.trace_native import LOADER

    assert LOADER.module is None or LOADER.module.state()[2] is False  # no backward callback
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    # the saved-tensors pack hook pushed for the next traced step is popped: left there, it
    # kept torch.compile from compiling any frame of this thread for the rest of the process
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None
    wait_until(lambda: gc.collect() is not None and ref() is None, 60,  # its threads' last
               "the stopped agent is still referenced")  # turns end late on a busy machine


def test_an_agent_stopped_from_another_thread_pops_its_hook_at_the_next_step(make_agent):
    import threading

    import probe_agent

    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:  # an earlier compiled test would keep saved-bytes counting off
        dynamo.utils.counters.clear()
    agent = make_agent(trace="on")
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        opt.zero_grad()

    for _ in range(2):
        step()
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is not None
    # WHEN the agent is stopped from another thread (an eval, `probe inject` detaching)
    stopper = threading.Thread(target=probe_agent.stop)
    stopper.start()
    stopper.join(30)
    del agent
    # THEN the hook is still on this thread's stack (only this thread can pop it) until its
    # next optimizer step, which pops it and leaves no optimizer hook behind
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is not None
    step()
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None
    from torch.optim import optimizer

    assert not optimizer._global_optimizer_post_hooks


def test_user_grad_fn_hooks_work_beside_the_tracers(make_agent):
    # GIVEN a traced step, and a user who hooks the grad_fns the tracer hooks (it registers
    # through its own Function._register_hook): one inside a module before the tracer does,
    # one on the model's output after it, and one that is removed again
    fired: list[str] = []

    class Tagged(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.relu()
            y.grad_fn.register_prehook(lambda g: fired.append("before"))
            return y

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.tag = Tagged()
            self.head = nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.tag(self.lin(x)))

    agent = make_agent(trace="on")
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.step()  # the first step boundary: the next steps are traced
    out = model(torch.randn(2, 4))
    after = out.grad_fn.register_prehook(lambda g: fired.append("after"))
    out.grad_fn.register_prehook(lambda g: fired.append("removed")).remove()
    # WHEN backward runs
    out.sum().backward()
    opt.step()
    # THEN each user hook fired once, the removed one never, the user's handle is torch's, and
    # the tracer still saw every module's backward
    assert sorted(fired) == ["after", "before"]
    assert type(after).__name__ == "RemovableHandle"
    got = rows(agent, "SELECT module FROM torch_trace WHERE stage = 'backward' ORDER BY module")
    assert [r[0] for r in got] == ["Net", "head", "lin", "tag"]


def test_untraced_steps_leave_module_call_and_hook_registration_as_torch_has_them(make_agent):
    # GIVEN an agent sampling every 2nd step
    call_before = nn.Module.__call__
    agent = make_agent(trace="every:2")
    tracer = agent.collectors.tracer
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for _ in range(4):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        # the step that starts now is traced or not; torch is patched only for traced ones
        # (the Python path stands in for Function._register_hook, the C++ one adds a
        # RecordFunction callback for backward nodes)
        backward_patched = tracer.native.state()[2] if tracer.on_native else \
            "_register_hook" in torch.autograd.Function.__dict__
        seen.append((tracer.recording, nn.Module.__call__ is not call_before, backward_patched))
    # THEN traced steps had both patches and untraced steps neither
    assert {s[0] for s in seen} == {True, False}
    assert all(s[0] == s[1] == s[2] for s in seen), seen


def test_the_jobs_own_saved_tensor_hooks_around_a_step_are_left_as_the_job_set_them(make_agent):
    # GIVEN a traced job whose own saved-tensors context spans its optimizer steps
    agent = make_agent(trace="on")
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []

    def pack(t):
        seen.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for _ in range(3):
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
        inside = len(seen)
    # THEN its hooks ran for every step, and when its context ends nothing is left pushed:
    # the agent did not put its own on top (which the context's exit would have popped instead)
    assert inside > 0
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None
    assert agent.collectors.tracer.saved.foreign_skips >= 1
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    assert len(seen) == inside  # the job's hook is really gone
