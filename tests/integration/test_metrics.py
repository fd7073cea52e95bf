"""``GET /v1/metrics`` (issue 15) against a real agent: Prometheus text that
prometheus_client's parser accepts, with a step counter that advances as the job steps."""

from __future__ import annotations

import httpx
import pytest

torch = pytest.importorskip("torch")
parser = pytest.importorskip("prometheus_client.parser")


def _families(client: httpx.Client) -> dict[str, object]:
    resp = client.get("/v1/metrics")
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {f.name: f for f in parser.text_string_to_metric_families(resp.text)}


def _value(families: dict[str, object], name: str) -> float:
    (sample,) = [s for s in families[name].samples if s.name == name]
    return sample.value


def _steps(n: int) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()


def test_metrics_parse_and_step_advances(agent, client):
    # GIVEN an agent whose step clock has seen 3 optimizer steps
    assert agent.stepclock.poll()
    _steps(3)
    agent.store.flush()
    first = _families(client)
    # WHEN the job steps twice more
    _steps(2)
    agent.store.flush()
    second = _families(client)
    # THEN the step advances by 2, and the families carry the rank labels
    assert _value(second, "probe_step") - _value(first, "probe_step") == 2
    step = second["probe_step"].samples[0]
    assert {"rank", "local_rank", "host", "job"} <= set(step.labels)
    assert step.labels["rank"] == "0"
    assert _value(second, "probe_step_duration_seconds") > 0
    assert _value(second, "probe_memory_rss_bytes") > 2**20
    assert second["probe_trace_mode"].samples[0].labels["mode"]
    assert {"probe_collective_wait_seconds", "probe_nonfinite_grad_steps",
            "probe_trace_dropped_rows"} <= set(second)


def test_metrics_need_the_token_like_other_data_routes(make_agent):
    # GIVEN an agent with a job token
    agent = make_agent(token="s3cret")
    with httpx.Client(base_url=agent.url, timeout=5.0) as c:
        # WHEN a scraper comes without it, then with it as Bearer
        refused = c.get("/v1/metrics", headers={"Authorization": "Bearer wrong"})
        allowed = c.get("/v1/metrics", headers={"Authorization": "Bearer s3cret"})
    # THEN only the token holder is served
    assert refused.status_code in (401, 403)
    assert allowed.status_code == 200 and "probe_up" in allowed.text
