"""``GET /v1/metrics`` (issue 15) against a real agent: Prometheus text that
prometheus_client's parser accepts, with a step counter that advances as the job steps."""

from __future__ import annotations

import io
import time

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
    # the job's memory is python.job_memory's, the figure doctor and `probe memory` judge
    job = _value(second, "probe_memory_job_bytes")
    judged = agent.store.query("SELECT host_mib FROM python.job_memory "
                               "ORDER BY step DESC, timestamp DESC LIMIT 1").rows[0][0]
    assert 0 < job < _value(second, "probe_memory_rss_bytes")
    assert job == judged * 2**20
    assert second["probe_trace_mode"].samples[0].labels["mode"]
    assert "probe_collective_wait_seconds" in second
    # AND counters parse as counters, with their _total samples (not as `unknown`)
    for family in ("probe_nonfinite_grad_steps", "probe_trace_dropped_rows"):
        assert second[family].type == "counter", second[family]
        assert [s.name for s in second[family].samples] == [family + "_total"], second[family]
    assert not [f.name for f in second.values() if f.type == "unknown"]


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


DOCKER = __import__("pathlib").Path(__file__).resolve().parents[2] / "docker"


def test_docker_scrape_config_and_grafana_dashboard_match_what_the_agent_serves(agent, client):
    """No Docker engine here: the files are parsed, and every metric the Grafana panels and
    the scrape config rely on is one a real agent serves."""
    import json
    import re

    yaml = pytest.importorskip("yaml")
    # GIVEN what a real agent serves after a step
    assert agent.stepclock.poll()
    _steps(4)
    agent.store.flush()
    served = set(_families(client))
    # WHEN the docker files are read
    prom = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    dash = json.loads((DOCKER / "grafana-probe-dashboard.json").read_text())
    # THEN Prometheus scrapes /v1/metrics of the four demo ranks with a Bearer token file
    (job,) = prom["scrape_configs"]
    assert job["metrics_path"] == "/v1/metrics"
    assert job["authorization"]["type"] == "Bearer" and job["authorization"]["credentials_file"]
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == ["node0:9700", "node0:9701", "node1:9702", "node1:9703"]
    # AND compose runs both next to the 2-node job, mounting files that exist
    assert {"node0", "node1", "prometheus", "grafana"} <= set(compose["services"])
    for name in ("prometheus", "grafana"):
        for vol in compose["services"][name]["volumes"]:
            src = vol.split(":")[0]
            if src == "./probe.env":  # the operator's copy of probe.env.example (README)
                src += ".example"
            assert (DOCKER / src).exists(), vol
    # AND every Grafana panel queries a family the agent serves
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(dash["panels"]) >= 10
    names = {re.sub(r"_total$", "", n) for e in exprs for n in re.findall(r"probe_\w+", e)}
    # CUDA families appear once a job uses CUDA, samples/s once the job's batches are counted,
    # memory by kind once a step is traced (test_metrics_carry_memory_by_kind), throughput
    # once a traced step has counted tokens and FLOPs (the throughput gauges' own test)
    later = {n for n in names if n.startswith("probe_cuda_")} | {
        "probe_samples_per_second", "probe_memory_kind_bytes", "probe_tokens_per_second",
        "probe_flops_per_second", "probe_mfu", "probe_step_share", "probe_pause_share"}
    assert names - later <= served, names - later - served


def test_metrics_carry_memory_by_kind(make_agent):
    # GIVEN an agent tracing every step of an AdamW loop
    agent = make_agent(trace="on")
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
    agent.collectors.steps.flush(final=True)
    agent.store.flush()
    # WHEN a scraper asks
    with httpx.Client(base_url=agent.url, timeout=10.0) as c:
        fams = _families(c)
    # THEN one gauge per kind: the parameters' bytes exactly, AdamW's two states twice that
    got = {s.labels["kind"]: s.value for s in fams["probe_memory_kind_bytes"].samples}
    p_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert set(got) == {"parameters", "gradients", "optimizer", "activations", "other"}
    assert got["parameters"] == pytest.approx(p_bytes) == got["gradients"]
    assert 2 * p_bytes <= got["optimizer"] <= 2 * p_bytes + 64
    assert got["activations"] > 0


def test_metrics_pass_through_the_watchdog(make_agent):
    # GIVEN an agent behind its watchdog (the watchdog owns the public socket)
    agent = make_agent(watchdog=True)
    # WHEN a scraper asks the public address
    with httpx.Client(base_url=agent.url, timeout=10.0) as c:
        resp = c.get("/v1/metrics")
    # THEN the exposition comes through, content type included
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "probe_up" in {f.name for f in parser.text_string_to_metric_families(resp.text)}


def test_throughput_gauges_are_probe_throughputs_numbers(agent, client):
    """Tokens/s, FLOP/s, MFU and the step shares per part: the throughput query's row."""
    # GIVEN a token model traced on every step (integer input [8, 16], one micro-batch)
    assert agent.stepclock.poll()
    agent.collectors.tracer.set_mode("on")
    model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # 16 steps: the first ones carry one-off costs (the CPU peak probe, the schedule read, the
    # FLOP-measured step), and the shares are medians
    for _ in range(16):
        opt.zero_grad()
        model(torch.randint(0, 32, (8, 16))).logsumexp(-1).mean().backward()
        opt.step()
    agent.store.flush()
    # WHEN Prometheus scrapes
    fams = _families(client)
    # THEN the gauges are the row `probe throughput` shows for this rank
    res = agent.store.query("SELECT tokens, tokens_per_s, flops_per_s FROM python.steps "
                            "WHERE NOT flops_measured AND tokens IS NOT NULL ORDER BY step")
    assert res.rows and all(r[0] == 8 * 16 for r in res.rows), res.rows
    assert _value(fams, "probe_tokens_per_second") > 0
    assert _value(fams, "probe_flops_per_second") > 0
    parts = {s.labels["part"]: s.value for s in fams["probe_step_share"].samples}
    assert set(parts) == {"forward", "backward", "optimizer", "input", "collective", "host"}
    assert 0 < parts["forward"] < 1 and 0.5 < sum(parts.values()) < 1.5
    # AND no pauses: no save, no eval
    pauses = {s.labels["part"]: s.value for s in fams["probe_pause_share"].samples}
    assert pauses == {"checkpoint": 0, "eval": 0}, pauses


def test_pause_gauge_is_the_saves_share_of_the_wall_time(agent, client):
    # GIVEN a loop that saves a checkpoint every other step and evaluates every fourth
    assert agent.stepclock.poll()
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    agent.store.flush()  # the writer's tick installs the save and train() wrappers
    for i in range(8):
        opt.zero_grad()
        model(torch.randn(8, 256)).sum().backward()
        opt.step()
        if i % 2:
            torch.save(model.state_dict(), io.BytesIO())
        if i % 4 == 3:
            model.eval()
            with torch.no_grad():
                model(torch.randn(8, 256))
            time.sleep(0.005)  # an eval's own work: a share the first steps' one-off costs
            model.train()      # (the CPU peak probe, the schedule read) cannot round to 0
    agent.store.flush()
    # WHEN Prometheus scrapes
    fams = _families(client)
    # THEN the pause gauge is the throughput query's share of the wall time in saves and eval
    pauses = {s.labels["part"]: s.value for s in fams["probe_pause_share"].samples}
    res = agent.store.query("SELECT sum(ckpt_wait), sum(eval_wait), count(*) FILTER "
                            "(WHERE ckpt_wait > 0), count(*) FILTER (WHERE eval_wait > 0) "
                            "FROM python.step_stats")
    ck, ev, n_ck, n_ev = res.rows[0]
    # saves after steps 2, 4, 6 (8: no step 9 yet) land in 3, 5, 7; the eval after step 4 in 5
    assert (n_ck, n_ev) == (3, 1), res.rows
    assert 0 < pauses["checkpoint"] < 1 and 0 < pauses["eval"] < 1, pauses
