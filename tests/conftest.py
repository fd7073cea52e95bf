"""Shared fixtures: a real agent on 127.0.0.1 port 0, bounded waits, torchrun helpers."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator

import pytest

from tests.support import agent_threads, cuda_available, wait_until

# Fixture modules shared across test folders: registered here, so tests name their fixtures as
# parameters (importing a fixture into a test module shadows it and hides real mistakes).
pytest_plugins = ["tests.fullfs"]


@pytest.fixture
def run_dir() -> Iterator[str]:
    """A short run dir: unix socket paths must stay under 108 bytes."""
    d = tempfile.mkdtemp(prefix="probe-t-", dir="/tmp")
    yield os.path.join(d, "run")
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def make_agent(run_dir: str) -> Iterator[Callable[..., object]]:
    """Start agents with ``make_agent(**config_overrides)``; all are stopped at teardown and no
    ``probe-agent.*`` thread may survive them (catches thread leaks)."""
    pytest.importorskip("duckdb")
    import probe_agent
    from probe_agent.config import AgentConfig

    def make(**overrides: object) -> object:
        overrides.setdefault("port", 0)
        overrides.setdefault("run_dir", run_dir)
        overrides.setdefault("watchdog", False)
        overrides.setdefault("serve_cpu", 1.0)  # no serving budget unless a test is about it
        overrides.setdefault("trace_native", "off")  # the C++ hot path only where asked for
        return probe_agent.start(AgentConfig(**overrides))

    yield make
    probe_agent.stop()
    wait_until(lambda: not agent_threads(), 10, f"agent threads left: {agent_threads()}")


@pytest.fixture(scope="session")
def native_hot_path() -> object:
    """The tracer's C++ hot path, built (once per machine and torch) and loaded. Skips only
    where there is no C++ compiler; a build that fails on a machine with one fails the test.
    Waits as long as the build itself may take (``BUILD_TIMEOUT_S``); the tests that may pay
    for the build get that much more time (``pytest_collection_modifyitems``)."""
    torch = pytest.importorskip("torch")
    from probe_agent.collectors.tracer.trace_native import BUILD_TIMEOUT_S, LOADER, compiler

    if compiler() is None:
        pytest.skip("no C++ compiler: the tracer keeps its Python hot path")
    LOADER.request(torch, "auto")
    LOADER.ready.wait(BUILD_TIMEOUT_S)
    assert LOADER.module is not None, LOADER.status
    return LOADER.module


@pytest.fixture(params=["python", "native"])
def hot_path(request: pytest.FixtureRequest) -> str:
    """Runs a tracing test on both of the tracer's hot paths (``trace_native.py``)."""
    if request.param == "native":
        request.getfixturevalue("native_hot_path")
    return str(request.param)


@pytest.fixture
def store() -> Iterator[object]:
    """A started Store alone (no agent), with a 1 MB retention budget; stopped after."""
    from probe_agent.config import AgentConfig
    from probe_agent.store.store import Store  # here: unit tests never load duckdb

    s = Store(AgentConfig(port=0, retention_mb=1))
    s.start()
    yield s
    s.stop()


@pytest.fixture
def agent(make_agent: Callable[..., object]) -> object:
    return make_agent()


@pytest.fixture
def client(agent: object) -> Iterator[object]:
    import httpx

    with httpx.Client(base_url=agent.url, timeout=10) as c:  # type: ignore[attr-defined]
        yield c


def _may_build_native(item: pytest.Item) -> bool:
    """Whether this test may be the first to need the C++ hot path (and so wait for its build)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return ("native_hot_path" in getattr(item, "fixturenames", ())
            or params.get("hot_path") == "native")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The first test to use the C++ hot path waits for its build, which may take up to the
    # build's own limit (trace_native.BUILD_TIMEOUT_S, 900 s): its timeout is its own plus that,
    # so a slow build fails on the fixture's assertion (with the loader's status), not on a
    # pytest-timeout kill at 120-300 s.
    building = [item for item in items if _may_build_native(item)]
    if building:
        from probe_agent.collectors.tracer.trace_native import BUILD_TIMEOUT_S
    for item in building:
        own = item.get_closest_marker("timeout")
        base = own.args[0] if own and own.args else float(config.getini("timeout") or 0)
        item.add_marker(pytest.mark.timeout(base + BUILD_TIMEOUT_S), append=False)
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none visible (torch.cuda.is_available())")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def _forget_compiled_frames() -> Iterator[None]:
    """A module that compiled with torch.compile leaves dynamo's frame counters up, and every
    later agent in this process then takes the process for a compiled job (no FLOP
    measurement, no MoE hooks, no saved-bytes hooks): cleared when the module ends."""
    yield
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.utils.counters.clear()


# A suite started in the background of a non-interactive shell (`nohup bash .ci/run &`)
# inherits SIGINT ignored, and so would every process it starts (an ignored signal stays
# ignored across exec): each test that presses Ctrl-C on a CLI or a job then fails (seen: 9 of
# them in one local run of .ci/run). Handled here, the processes the tests start get the
# default back at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
