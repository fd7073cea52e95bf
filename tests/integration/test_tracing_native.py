"""The tracer's C++ hot path (trace_native.py): what happens when it cannot be built, how it is
configured, and what it records that the Python path cannot (issue 3). The rows themselves are
checked on both paths by the other tracing tests (``hot_path`` fixture)."""

from __future__ import annotations

import logging
import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("duckdb")

import torch.nn as nn  # noqa: E402

from probe_agent.collectors.tracer.trace_native import NativeLoader, ext_name  # noqa: E402
from probe_agent.config import AgentConfig  # noqa: E402
from probe_agent.errors import ConfigError  # noqa: E402
from tests.integration.tracing_support import rows  # noqa: E402


@pytest.mark.timeout(300)
def test_a_failing_compiler_leaves_the_python_path_and_says_why_once(tmp_path, monkeypatch,
                                                                     caplog):
    # GIVEN a machine whose C++ compiler fails, and an empty cache
    monkeypatch.setenv("PROBE_NATIVE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "false")
    loader = NativeLoader()
    # WHEN the loader is asked (twice: only one build runs)
    with caplog.at_level(logging.WARNING):
        loader.request(torch, "auto")
        loader.request(torch, "auto")
        assert loader.ready.wait(280), loader.status
    # THEN nothing was loaded, the status names the compiler's log, and the log says it once
    # with the way out
    assert loader.module is None
    log_file = tmp_path / "cache" / ext_name(torch) / "build.log"
    assert loader.describe() == f"python (build failed: see {log_file})", loader.describe()
    assert "did not build" in log_file.read_text()
    warned = [r.getMessage() for r in caplog.records if "hot path" in r.getMessage()]
    assert len(warned) == 1 and "PROBE_TRACE_NATIVE=off" in warned[0], warned
    assert not (tmp_path / "cache" / ext_name(torch) / f"{ext_name(torch)}.so").exists()


def test_no_compiler_says_so_and_runs_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PROBE_NATIVE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no c++, g++ or clang++ here
    loader = NativeLoader()
    loader.request(torch, "auto")
    assert loader.ready.wait(60), loader.status
    assert loader.describe().startswith("python (no compiler: "), loader.describe()
    assert "CXX" in loader.describe() and loader.module is None


@pytest.mark.timeout(300)
def test_a_lock_left_by_a_killed_build_does_not_block_the_next(tmp_path, monkeypatch):
    # GIVEN the lock file of a build that was killed a moment ago (and a compiler that fails,
    # so that the build ends quickly once it starts)
    monkeypatch.setenv("PROBE_NATIVE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "false")
    d = tmp_path / "cache" / ext_name(torch)
    d.mkdir(parents=True)
    (d / "lock").touch()
    # WHEN the loader builds
    loader = NativeLoader()
    loader.request(torch, "auto")
    # THEN the build ran (and failed on the compiler) instead of waiting for the lock forever
    assert loader.ready.wait(280), loader.status
    assert loader.status.startswith("python: build failed"), loader.status
    assert not (d / "lock").exists()


def test_native_off_never_starts_a_build(tmp_path, monkeypatch):
    monkeypatch.setenv("PROBE_NATIVE_DIR", str(tmp_path / "cache"))
    before = {t.name for t in threading.enumerate()}
    loader = NativeLoader()
    loader.request(torch, "off")
    assert loader.status == "off" and loader.module is None
    assert "probe-native-build" not in {t.name for t in threading.enumerate()} - before
    assert not (tmp_path / "cache").exists()


def test_a_bad_native_setting_is_a_config_error():
    with pytest.raises(ConfigError, match="PROBE_TRACE_NATIVE"):
        AgentConfig.from_env({"PROBE_TRACE_NATIVE": "sometimes"})
    assert AgentConfig.from_env({"PROBE_TRACE_NATIVE": " OFF "}).trace_native == "off"
    assert AgentConfig.from_env({}).trace_native == "auto"


def _sgd_steps(model: nn.Module, steps: int) -> torch.optim.Optimizer:
    """``steps`` SGD steps of ``model(randn(2, 4)).sum()``; returns the optimizer."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    return opt


def test_native_backward_rows_of_a_module_whose_graph_is_built_on_another_thread(
        make_agent, native_hot_path):
    # GIVEN the C++ path, and a model whose second layer runs on a helper thread (its grad_fn
    # counts that thread's sequence numbers: the C++ path names nodes by thread and number)
    agent = make_agent(trace="on", trace_native="auto")
    tracer = agent.collectors.tracer

    class Threaded(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 1)

        def forward(self, x):
            h = self.a(x)
            out: list[torch.Tensor] = []
            t = threading.Thread(target=lambda: out.append(self.b(h)))
            t.start()
            t.join()
            return out[0]

    model = Threaded()
    _sgd_steps(model, 3)
    # THEN the steps ran on the C++ path and every call has its backward row
    assert tracer.state()["hot_path"] == "native"
    got = rows(agent, "SELECT step, list(module ORDER BY module) FROM torch_trace "
                      "WHERE stage = 'backward' AND step >= 2 GROUP BY step ORDER BY step")
    assert got == [[2, ["Threaded", "a", "b"]], [3, ["Threaded", "a", "b"]]], got


def test_native_keeps_only_the_backward_events_of_nodes_forward_records_name(
        make_agent, native_hot_path):
    # GIVEN the C++ path, and a module whose forward makes several autograd nodes, of which
    # only the output's is named by a forward record
    agent = make_agent(trace="on", trace_native="auto")
    tracer = agent.collectors.tracer

    class Busy(nn.Module):
        def forward(self, x):
            return ((x * 2 + 1).relu() * 3).sum(dim=1, keepdim=True)

    model = nn.Sequential(nn.Linear(4, 4), Busy())
    opt = _sgd_steps(model, 2)
    assert tracer.state()["hot_path"] == "native"
    # WHEN a traced step's backward runs (~10 nodes: the ops, the weight's transpose, two
    # AccumulateGrads)
    loss = model(torch.randn(2, 4)).sum()
    before = native_hot_path.state()[4]
    loss.backward()
    events = native_hot_path.state()[4] - before
    opt.step()
    # THEN the buffer holds the events of the two named nodes (Linear's addmm, Busy's sum, also
    # Sequential's output) and the pass end, and every call still has its backward row
    assert events == 3, events
    got = rows(agent, "SELECT list(module ORDER BY module) FROM torch_trace "
                      "WHERE stage = 'backward' AND step = 3")
    assert got == [[["0", "1", "Sequential"]]], got


def test_a_build_others_could_have_replaced_is_not_loaded(tmp_path, monkeypatch,
                                                          native_hot_path):
    import shutil

    # GIVEN a cached build in a directory that group and others may write to
    name = ext_name(torch)
    d = tmp_path / "cache" / name
    d.mkdir(parents=True)
    shutil.copy(native_hot_path.__file__, d / f"{name}.so")
    d.chmod(0o777)
    monkeypatch.setenv("PROBE_NATIVE_DIR", str(tmp_path / "cache"))
    # WHEN the loader finds it
    loader = NativeLoader()
    loader.request(torch, "auto")
    assert loader.ready.wait(60)
    # THEN it refuses it, says why and what to do, and keeps the Python path
    assert loader.module is None
    assert "not this user's alone" in loader.status and "PROBE_NATIVE_DIR" in loader.status
    # AND the same file in a private directory loads
    d.chmod(0o700)
    ok = NativeLoader()
    ok.request(torch, "auto")
    assert ok.ready.wait(60) and ok.status == "native", ok.status


def test_probe_info_and_trace_say_which_hot_path_and_why(make_agent, capsys):
    from probe_cli.main import main

    # GIVEN an agent whose C++ hot path is switched off, tracing a few steps
    agent = make_agent(trace="on")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    where = agent.url.removeprefix("http://")
    # WHEN `probe info` and `probe trace` ask it, THEN both say the Python path runs, and why
    for command in ("info", "trace"):
        assert main([where, command]) == 0
        out = capsys.readouterr().out
        assert "hot_path" in out.splitlines()[0], out
        assert "python (off: PROBE_TRACE_NATIVE=off)" in out, out
        if command == "info":
            # AND `probe info` lists what the agent replaced in the process, and by which part
            assert "What probe changed in the process (rank 0):" in out, out
            assert "torch.nn.modules.module.Module.__call__  [tracer]" in out, out
            assert "torch.optim.optimizer._global_optimizer_post_hooks[" in out, out
