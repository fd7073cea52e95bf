"""The loss without a line of code, the gradient norm of every step, and the first NaN's origin
(issue 40), on a real agent and real torch loops in this process.

Each test runs a small loop and compares what the agent recorded with what the loop itself
computed (the loss it would print), or with the fault it planted (the module, the sample).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("duckdb")

import probe_agent  # noqa: E402
from tests.integration.tracing_support import rows  # noqa: E402

nn = torch.nn


def _data(n: int = 512, seed: int = 0) -> Any:
    g = torch.Generator().manual_seed(seed)
    ds = torch.utils.data.TensorDataset(torch.randn(n, 8, generator=g),
                                        torch.randint(0, 4, (n,), generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, generator=g)


def _model() -> Any:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _losses(agent: Any) -> dict[int, tuple[float, str]]:
    return {s: (v, src) for s, v, src in rows(
        agent, "SELECT step, loss, loss_source FROM python.steps ORDER BY step")}


def _train(steps: int, accum: int = 1, divide: bool = True, scaler: Any = None,
           poison: tuple[int, int, int] | None = None, model: Any = None) -> list[float]:
    """The loop; returns the loss it would print per step (nanoGPT's loss_accum when it
    divides, else the mean of its micro-batches)."""
    model = model or _model()
    opt = torch.optim.AdamW(model.parameters(), 1e-2)
    it = iter(_data())
    printed = []
    for step in range(steps):
        got = []
        for mb in range(accum):
            x, y = next(it)
            if poison is not None and (step, mb) == poison[:2]:
                x = x.clone()
                x[poison[2]] = float("nan")
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=scaler is not None):
                loss = nn.functional.cross_entropy(model(x), y)
            if divide and accum > 1:
                loss = loss / accum
            got.append(loss.item())
            (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad()
        printed.append(sum(got) if divide else sum(got) / len(got))
    return printed


@pytest.mark.parametrize("accum,divide", [(1, True), (3, True), (3, False)])
def test_the_recorded_loss_is_the_one_the_loop_prints(make_agent, accum, divide):
    # GIVEN an agent and a plain loop (with and without gradient accumulation)
    agent = make_agent(trace="off")
    # WHEN it trains, logging nothing
    printed = _train(6, accum=accum, divide=divide)
    # THEN python.steps holds the loss the loop computed, step by step
    got = _losses(agent)
    assert sorted(got) == list(range(1, 7))
    for step, want in enumerate(printed, 1):
        assert got[step][0] == pytest.approx(want, rel=1e-5), (step, got, printed)
        assert got[step][1] == "backward"


def test_a_gradscaler_loss_is_recorded_unscaled_and_log_overrides(make_agent):
    agent = make_agent(trace="off")
    scaler = torch.amp.GradScaler("cpu")
    printed = _train(4, accum=2, scaler=scaler)
    probe_agent.log(loss=123.0)  # the script's own value for the last step wins
    got = _losses(agent)
    for step, want in enumerate(printed[:3], 1):
        assert got[step][0] == pytest.approx(want, rel=1e-3), (got, printed)
    assert got[4] == (123.0, "logged")


def test_a_backward_on_a_meta_copy_is_not_the_steps_loss(make_agent):
    # GIVEN litgpt pretrain's habit: before its first step it counts FLOPs with forward and
    # backward on a meta-device copy of the model (no values: nothing to read)
    agent = make_agent(trace="off")
    with torch.device("meta"):
        meta = _model()
    nn.functional.cross_entropy(meta(torch.empty(4, 8, device="meta")),
                                torch.zeros(4, dtype=torch.long, device="meta")).backward()
    # WHEN the real loop then trains
    printed = _train(3)
    # THEN step 1's loss is the loop's (the meta value made it NaN: "NaN/Inf at step 1")
    got = _losses(agent)
    assert got[1][0] == pytest.approx(printed[0], rel=1e-5), (got, printed)
    assert not rows(agent, "SELECT step FROM python.numerics WHERE kind = 'anomaly'")


def test_a_nan_from_the_data_is_traced_to_its_sample_on_an_untraced_step(make_agent):
    # GIVEN a loop whose 9th step's second micro-batch has a NaN in row 5, traced every 4 steps
    agent = make_agent(trace="every:4")
    _train(12, accum=2, poison=(8, 1, 5))
    # THEN step 9 is the first non-finite one, and the re-run names the input and the sample
    first = agent.collectors.numerics.first_nonfinite
    assert first["step"] == 9 and first["stage"] == "input" and first["role"] == "received"
    assert first["micro_batch"] == 1 and first["samples_are"] == "dataloader indices"
    assert len(first["samples"]) == 1
    origin = rows(agent, "SELECT step, module, stage, samples FROM python.numerics "
                         "WHERE kind = 'origin'")
    assert origin == [[9, "Sequential", "input", str(first["samples"][0])]]
    # and every step has its total gradient norm, NaN from step 9 on
    totals = rows(agent, "SELECT step, grad_norm FROM python.numerics WHERE kind = 'step' "
                         "ORDER BY step")
    assert [s for s, _ in totals] == list(range(1, 13))
    assert all(math.isfinite(n) for s, n in totals if s < 9)
    assert all(isinstance(n, str) or not math.isfinite(n) for s, n in totals if s >= 9)
    # AND the dashboard's series marks those steps non-finite (and carries the loss before)
    import httpx

    with httpx.Client(base_url=agent.url, timeout=10.0) as c:
        body = c.post("/v1/queries/dashboard_series", json={"params": {"last": 20}}).json()
    series = {r[body["columns"].index("step")]: dict(zip(body["columns"], r))
              for r in body["rows"]}
    assert series[8]["loss"] > 0 and not series[8]["nonfinite"]
    assert series[9]["loss"] is None and series[9]["nonfinite"]


class Blows(nn.Module):
    """log() of its input: NaN for the rows whose first feature the test made negative."""

    def forward(self, x: Any) -> Any:
        return torch.log(x)


def test_a_nan_born_in_a_module_names_the_module_op_and_sample(make_agent):
    agent = make_agent(trace="every:100")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Sigmoid(), nn.Linear(16, 8), Blows(),
                          nn.Linear(8, 4))
    with torch.no_grad():  # log's input is 10 - 10.5 x sigmoid(x[:, 0]): > 0 for x < 3
        model[0].weight.zero_()
        model[0].bias.zero_()
        model[0].weight[0, 0] = 1.0
        model[2].weight.zero_()
        model[2].weight[:, 0] = -10.5
        model[2].bias.fill_(10.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for step in range(6):
        x = torch.rand(8, 8)
        if step == 4:
            x[6, 0] = 50.0  # sample 6 of step 5: sigmoid 1, log of -0.5
        loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    first = agent.collectors.numerics.first_nonfinite
    assert first["step"] == 5 and first["stage"] == "forward" and first["role"] == "produced"
    assert first["module"] == "3" and "log" in first["op"]
    assert first["samples"] == [6] and first["samples_are"] == "rows of the batch"


def test_a_nan_already_in_the_weights_is_named_as_the_weights_not_an_op(make_agent):
    """Before, a NaN written into an embedding row (a bad update, a loaded checkpoint) read
    "produced in the forward of module 'wte' by an op", next "clamp its input, add an
    epsilon": the forward of a finite batch made it, but the weights were bad before it."""
    agent = make_agent(trace="every:100")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 8), nn.Flatten(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        if step == 3:
            with torch.no_grad():
                model[0].weight[7] = float("nan")  # what `probe eval` did to nanoGPT's wte
        x = torch.randint(0, 7, (8, 4))
        x[2, 1] = 7  # sample 2 reads the bad row
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    first = agent.collectors.numerics.first_nonfinite
    assert first["step"] == 4 and first["stage"] == "weights", first
    assert first["module"] == "0" and first["param"] == "weight", first
    assert first["param_rows"] == [7] and first["bad_values"] == 8, first


class SqrtNorm(nn.Module):
    """The Euclidean norm written by hand: sqrt's backward divides by zero at a zero row."""

    def forward(self, x: Any) -> Any:
        return torch.sqrt((x * x).sum(-1, keepdim=True))


def test_a_nan_born_in_backward_names_the_module_and_node(make_agent):
    agent = make_agent(trace="every:100")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), SqrtNorm(), nn.Linear(1, 1))
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(8))
        model[0].bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for step in range(4):
        x = torch.rand(4, 8) + 0.1
        if step == 2:
            x[1] = 0.0  # a zero row: norm 0, finite forward, sqrt's backward divides by 0
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    first = agent.collectors.numerics.first_nonfinite
    assert first["step"] == 3 and first["loss_finite"], first
    assert first["stage"] == "backward" and first["module"] == "1", first
    assert "SqrtBackward0" in first["op"], first


def test_traced_steps_have_module_rows(make_agent):
    agent = make_agent(trace="every:2")
    _train(4)
    got = rows(agent, "SELECT step, module, grad_norm, weight_norm, update_ratio, max_abs_act "
                      "FROM python.numerics WHERE kind = 'module' ORDER BY step, module")
    by = {(s, m): r for s, m, *r in got}
    for step in (2, 4):
        for module in ("0", "2"):
            g, w, ratio, act = by[(step, module)]
            assert g > 0 and w > 0 and 0 < ratio < 1 and act > 0, (step, module, by)
        assert by[(step, "1")][3] > 0  # the ReLU: no parameters, an activation


def test_metrics_export_the_loss_and_norm_and_thresholds_change_live(make_agent):
    import httpx

    agent = make_agent(trace="off")
    printed = _train(3)
    agent.collectors.steps.flush(final=True)
    agent.store.flush()
    with httpx.Client(base_url=agent.url, timeout=10.0) as c:
        text = c.get("/v1/metrics").text
        loss = [ln for ln in text.splitlines() if ln.startswith("probe_loss{")]
        norm = [ln for ln in text.splitlines() if ln.startswith("probe_grad_norm{")]
        assert len(loss) == 1 and float(loss[0].split()[-1]) == pytest.approx(printed[-1],
                                                                               rel=1e-5)
        assert len(norm) == 1 and float(norm[0].split()[-1]) > 0
        # thresholds: changed while the job runs, refused with a one-line reason when unknown
        r = c.post("/v1/numerics", json={"thresholds": {"spike_factor": 3}})
        assert r.status_code == 200 and r.json()["numerics"]["thresholds"]["spike_factor"] == 3
        bad = c.post("/v1/numerics", json={"thresholds": {"spike": 3}})
        assert bad.status_code == 400 and "unknown threshold 'spike'" in bad.json()["error"]
        state = c.get("/v1/doctor").json()["numerics"]
        assert state["thresholds"]["spike_factor"] == 3 and state["loss_source"] == "backward"
    audit = rows(agent, "SELECT code FROM python.audit WHERE code LIKE 'numerics%'")
    assert len(audit) == 1
