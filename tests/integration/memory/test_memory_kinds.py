"""Memory by kind on traced steps (issue 29): parameters, gradients, optimizer state in
python.memory, and the activations each module's own forward saved in python.torch_trace."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("duckdb")

from tests.integration.memory_support import (  # noqa: E402
    AttnHeavy,
    HarnessCounter,
    steps,
    tokens,
)
from tests.integration.tracing_support import rows  # noqa: E402

_MIB = 1 / 2**20


def _state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))


@pytest.mark.parametrize("hot_path", ["python", "native"])
def test_saved_bytes_per_module_match_an_independent_count(make_agent, hot_path, request):
    """The module saving the most comes first, and each module's own saved bytes are within
    5% of what the test's own saved_tensors_hooks counted in the same step."""
    if hot_path == "native":
        request.getfixturevalue("native_hot_path")
    # GIVEN an agent tracing every step, and the harness counting under its own hooks
    agent = make_agent(trace="on", trace_native="auto" if hot_path == "native" else "off")
    torch.manual_seed(0)
    model = AttnHeavy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    harness = HarnessCounter(model)
    idx, tgt = tokens()
    counts = {}
    # WHEN four AdamW steps run (the agent counts from step 2, its first full traced step)
    for step in range(1, 5):
        harness.reset()
        with harness.counting():
            model(idx, tgt).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        counts[step] = dict(harness.by_module)
    # THEN step 3's modules rank the same, the attention-like block first
    got = rows(agent, "SELECT module, sum(saved_bytes) FROM torch_trace WHERE step = 3 AND "
                      "stage = 'forward' AND NOT recompute GROUP BY module ORDER BY 2 DESC")
    ours = {m: b for m, b in got}
    assert got[0][0] == "attn", got
    want = counts[3]
    assert max(want, key=want.get) == "attn"
    for module, b in want.items():
        assert ours.get(module, 0) == pytest.approx(b, rel=0.05), (module, ours, want)
    # AND modules that saved nothing have 0, not NULL; backward rows have NULL
    assert all(b is not None for b in ours.values())
    assert rows(agent, "SELECT count(saved_bytes) FROM torch_trace WHERE stage <> 'forward'") \
        == [[0]]
    # AND python.memory's activations are the step's total
    act = rows(agent, "SELECT activations_mib FROM memory WHERE step = 3")[0][0]
    assert act == pytest.approx(sum(want.values()) * _MIB, rel=0.05)


def test_parameter_gradient_and_optimizer_bytes_are_exact(make_agent):
    # GIVEN an agent tracing every second step
    agent = make_agent(trace="every:2")
    torch.manual_seed(0)
    model = AttnHeavy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # WHEN four steps run
    steps(model, opt, 4)
    # THEN traced steps have exact counts: AdamW keeps two fp32 states per parameter
    p_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    got = rows(agent, "SELECT step, params_mib, grads_mib, optimizer_mib, activations_mib "
                      "FROM memory ORDER BY step")
    by = {r[0]: tuple(r[1:]) for r in got}
    assert by[1] == (None, None, None, None) and by[3][0] is None  # untraced steps
    params, grads, optim, act = by[4]
    assert params == pytest.approx(p_bytes * _MIB)
    assert grads == pytest.approx(p_bytes * _MIB)
    assert optim == pytest.approx(_state_bytes(opt) * _MIB)
    assert 2 * p_bytes * _MIB <= optim < 2 * p_bytes * _MIB + 0.01  # + the step counters
    assert act > 0


def test_a_master_copy_is_optimizer_state_after_a_top_level_loss_module(make_agent):
    """DeepSpeedExamples' CIFAR under ZeRO-2 showed half its parameters: its torch optimizer
    steps a flat fp32 partition (a plain tensor, a master copy), and the last module called at
    top level each step is the loss (``criterion = nn.CrossEntropyLoss()``), which has none."""
    # GIVEN a model, a loss module called after it, and an optimizer over fp32 master copies
    agent = make_agent(trace="on")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    master = flat[: flat.numel() // 2].clone().requires_grad_(True)  # this rank's half
    opt = torch.optim.AdamW([master], lr=1e-3)
    criterion = torch.nn.CrossEntropyLoss()
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    # WHEN three steps run (the master's gradient from the model's, as ZeRO does)
    for _ in range(3):
        loss = criterion(model(x), y)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        master.grad = grads[: master.numel()].clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
    # THEN the parameters are the model's; the master copy and its state are the optimizer's
    p_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    params, optim = rows(agent, "SELECT params_mib, optimizer_mib FROM memory "
                                "ORDER BY step DESC LIMIT 1")[0]
    assert params == pytest.approx(p_bytes * _MIB), (params * 2**20, p_bytes)
    m_bytes = master.numel() * master.element_size()
    assert optim == pytest.approx((_state_bytes(opt) + m_bytes) * _MIB)


def test_input_bytes_are_the_calls_tensor_arguments(make_agent):
    # GIVEN an agent tracing every step and the attention-like model
    agent = make_agent(trace="on")
    model = AttnHeavy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # WHEN three steps run
    steps(model, opt, 3)
    # THEN the attention block's input is the (16, 128, 32) float32 residual stream, and the
    # root's is the two int64 token batches
    got = dict(rows(agent, "SELECT module, input_bytes FROM torch_trace WHERE step = 3 AND "
                           "stage = 'forward'"))
    assert got["attn"] == 16 * 128 * 32 * 4
    assert got["AttnHeavy"] == 2 * 16 * 128 * 8


class _SkipsALayer(torch.nn.Module):
    """Two layers, the second skipped on request; ``extra`` modules (a plain list: not this
    module's parameters) run after them."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
        self.extra: list[torch.nn.Module] = []

    def forward(self, x: torch.Tensor, skip: bool) -> torch.Tensor:
        y = self.a(x) if skip else self.b(self.a(x))
        for m in self.extra:
            y = m(y)
        return y


def test_counts_follow_gradients_and_new_parameter_groups_every_traced_step(make_agent):
    """Parameter and optimizer-state bytes are counted again only when something they depend
    on changes; gradients, which come and go, are counted every step."""
    # GIVEN an agent tracing every step, and one root model whose second layer sits out step 4
    agent = make_agent(trace="on")
    torch.manual_seed(0)
    model = _SkipsALayer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 64)
    nbytes = sum(p.numel() * p.element_size() for p in model.a.parameters())
    for step in range(1, 7):
        if step == 5:  # WHEN a third layer joins the optimizer
            c = torch.nn.Linear(64, 64)
            model.extra.append(c)
            opt.add_param_group({"params": list(c.parameters())})
        model(x, skip=step == 4).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    got = {r[0]: r[1:] for r in rows(agent, "SELECT step, params_mib, grads_mib "
                                            "FROM memory ORDER BY step")}
    # THEN step 4 has only the first layer's gradients, steps 3 both layers'
    assert got[3][1] == pytest.approx(2 * nbytes * _MIB)
    assert got[4][1] == pytest.approx(nbytes * _MIB)
    # AND the new group's parameters count from the step it joined
    assert got[4][0] == pytest.approx(2 * nbytes * _MIB)
    assert got[5][0] == pytest.approx(3 * nbytes * _MIB)
    assert got[6][1] == pytest.approx(3 * nbytes * _MIB)
