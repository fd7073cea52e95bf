"""python.torch_trace rows from real models (issue 3): every module and traced step, backward
rows, seq for repeated calls, shared modules, several roots, activation checkpointing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("duckdb")

import httpx  # noqa: E402
import torch.nn as nn  # noqa: E402

from tests.integration.tracing_support import TinyGPT, named_modules, rows, train  # noqa: E402


def test_every_module_of_every_traced_step_has_forward_and_backward_rows(make_agent):
    # GIVEN an agent tracing every step
    agent = make_agent(trace="on")
    torch.manual_seed(0)
    model = TinyGPT()
    # WHEN three AdamW steps run
    train(model, 3)
    # THEN each step has a forward and a backward row for every module, and one optimizer step
    got = rows(agent, "SELECT step, stage, list(DISTINCT module) FROM torch_trace "
                      "GROUP BY ALL ORDER BY ALL")
    by = {(step, stage): set(mods) for step, stage, mods in got}
    assert {s for s, _ in by} == {1, 2, 3}
    expected = named_modules(model)
    for step in (1, 2, 3):
        assert by[(step, "forward")] == expected
        # wpe gets positions (no grad), but its output still joins the graph through the add
        assert by[(step, "backward")] == expected
        assert by[(step, "step")] == {"AdamW"}
    # AND durations are sane: positive, a parent's forward contains its children's
    bad = rows(agent, "SELECT count(*) FROM torch_trace WHERE duration < 0 OR duration IS NULL")
    assert bad == [[0]]
    root_fwd, block_fwd = rows(agent, "SELECT max(duration) FILTER (module = 'TinyGPT'), "
                                      "max(duration) FILTER (module = 'layers.0') "
                                      "FROM torch_trace WHERE stage = 'forward' AND step = 3")[0]
    assert root_fwd > block_fwd > 0
    # AND step numbers match the optimizer's steps in python.steps
    assert rows(agent, "SELECT list(step ORDER BY step) FROM steps") == [[[1, 2, 3]]]


class Shared(nn.Module):
    """One Linear used twice per forward, and tied into a second parent."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.wrap = nn.Sequential(self.lin)  # the same module under a second name

    def forward(self, x, targets):
        return ((self.wrap(self.lin(x)) - targets) ** 2).mean()


def test_repeated_and_shared_modules_carry_seq(make_agent):
    agent = make_agent(trace="on")
    model = Shared()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    # WHEN one step accumulates gradients over two micro-batches
    for _ in range(2):
        model(x, y).backward()
    opt.step()
    # THEN lin ran 4 times in step 1: seq 0..3 forward and backward (first name wins)
    got = rows(agent, "SELECT stage, list(seq ORDER BY seq) FROM torch_trace "
                      "WHERE module = 'lin' GROUP BY stage ORDER BY stage")
    assert got == [["backward", [0, 1, 2, 3]], ["forward", [0, 1, 2, 3]]]
    assert rows(agent, "SELECT DISTINCT step FROM torch_trace") == [[1]]


def test_several_root_models_are_told_apart(make_agent):
    agent = make_agent(trace="on")
    gen, disc = nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 1))
    disc2 = nn.Sequential(nn.Linear(4, 1))
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
    opt_d = torch.optim.SGD([*disc.parameters(), *disc2.parameters()], lr=0.1)
    for _ in range(2):
        (disc(gen(torch.randn(2, 4))).mean() + disc2(torch.randn(2, 4)).mean()).backward()
        opt_g.step()
        opt_d.step()
    got = rows(agent, "SELECT DISTINCT step, root, module, stage FROM torch_trace "
                      "WHERE stage <> 'backward' ORDER BY ALL")
    step2 = {tuple(r[1:]) for r in got if r[0] == 2}
    # both optimizers stepping in one iteration make one step, each with its own row
    assert {r[0] for r in got} == {1, 2}
    assert ("optimizer", "SGD", "step") in step2
    assert {("Sequential", "0", "forward"), ("Sequential#2", "0", "forward"),
            ("Sequential#3", "0", "forward"), ("Sequential", "Sequential", "forward")} <= step2
    assert rows(agent, "SELECT count(*) FROM torch_trace WHERE step = 2 AND stage = 'step'") \
        == [[2]]


def test_a_module_that_runs_backward_in_its_forward_still_gets_backward_rows(make_agent):
    # Backward pre-hooks are registered in a batch when a top-level module returns; a
    # train-step module that calls backward inside its forward must not lose them.
    class TrainStep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            loss = self.model(x).pow(2).mean()
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
            return loss.detach()

    agent = make_agent(trace="on")
    step = TrainStep()
    for _ in range(3):
        step(torch.randn(4, 4))
    got = rows(agent, "SELECT module, count(*) FROM torch_trace WHERE step = 2 "
                      "AND stage = 'backward' GROUP BY ALL ORDER BY 1")
    assert got == [["model", 1], ["model.0", 1], ["model.1", 1], ["model.2", 1]]


@pytest.mark.parametrize("variant", ["non-reentrant", "reentrant"])
def test_activation_checkpointing_recompute_is_flagged(make_agent, variant):
    agent = make_agent(trace="on")
    torch.manual_seed(0)
    model = TinyGPT(checkpoint=variant)
    losses = train(model, 2)
    torch.manual_seed(0)
    assert losses == pytest.approx(train(TinyGPT(), 2))  # checkpointing changes nothing
    got = dict(rows(agent, "SELECT recompute, count(*) FROM torch_trace "
                           "WHERE step = 2 AND module = 'layers.0.attn' GROUP BY ALL"))
    # one original forward + its backward, and one recomputed forward during backward
    assert got[True] == 1
    assert got[False] == 2
    stages = rows(agent, "SELECT DISTINCT stage FROM torch_trace WHERE recompute ORDER BY 1")
    assert stages == [["forward"]]


def test_sampling_every_n_and_runtime_change(make_agent):
    agent = make_agent(trace="every:3")
    model = TinyGPT(layers=1)
    train(model, 7)
    traced = rows(agent, "SELECT list(DISTINCT step ORDER BY step) FROM torch_trace")
    assert traced == [[[3, 6]]]
    # one optimizer row per traced step: the untraced step after it keeps its own (the root
    # wrapper is off then, so no root call tells the tracer a new step began)
    assert rows(agent, "SELECT step, count(*) FROM torch_trace WHERE stage = 'step' "
                       "GROUP BY ALL ORDER BY ALL") == [[3, 1], [6, 1]]
    assert rows(agent, "SELECT list(traced ORDER BY step) FROM steps") == [
        [[False, False, True, False, False, True, False]]]
    # WHEN the mode changes at run time, it applies from the next step
    client = httpx.Client(base_url=agent.url, timeout=10)
    r = client.post("/v1/trace", json={"mode": "off"})
    assert r.status_code == 200 and r.json()["mode"] == "off", r.text
    train(model, 3)  # steps 8-10 on a new optimizer: numbering continues from the clock
    r = client.post("/v1/trace", json={"mode": "every:2"})
    assert r.json()["mode"] == "every:2"
    assert client.post("/v1/trace", json={"mode": "sometimes"}).status_code == 422
    train(model, 2)
    traced = rows(agent, "SELECT list(DISTINCT step ORDER BY step) FROM torch_trace")
    assert traced == [[[3, 6, 12]]]
    state = client.get("/v1/trace").json()
    assert state["ok"] and state["rank"] == 0 and state["mode"] == "every:2"
    client.close()


def test_reads_resolve_the_trace_only_when_they_name_it(make_agent):
    # GIVEN an agent tracing every step, read once so its timed resolve is not due for 10 s
    agent = make_agent(trace="on")
    tracer = agent.collectors.tracer
    model = TinyGPT()
    train(model, 2)
    assert agent.store.query("SELECT max(step) FROM torch_trace").rows == [[2]]
    # WHEN a third step runs and a read names only python.steps
    train(model, 1)
    agent.store.query("SELECT count(*) FROM steps")
    # THEN the trace's records stay buffered (a resolve costs ~30 ms of DuckDB time) ...
    assert len(tracer.records.fw) > 0
    # ... and the next read that names torch_trace sees the new step at once
    assert agent.store.query("SELECT max(step) FROM torch_trace").rows == [[3]]
