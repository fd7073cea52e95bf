"""The seed playbook's "where is it stuck" query shows the training thread only, and no stack
view shows the agent's own frames (issue 17): traced module calls go through the tracer's
``native_call``/``traced_call``, which must not appear inside the user's stack."""

from __future__ import annotations

import json
import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("duckdb")

import torch.nn as nn  # noqa: E402

from probe_cli.main import main  # noqa: E402
from tests.integration.tracing_support import rows  # noqa: E402

SEED = "SELECT func, file, lineno, depth FROM python.backtrace ORDER BY depth LIMIT 10"


class Stuck(nn.Module):
    """Blocks in its forward until released: where the training thread is stuck."""

    def __init__(self, entered: threading.Event, release: threading.Event) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.entered, self.release, self.block = entered, release, False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.block:
            self.entered.set()
            self.release.wait(30)
        return self.lin(x)


def monitor_loop(stop: threading.Event) -> None:
    """Like tqdm's TMonitor: a thread that wakes up now and then."""
    while not stop.wait(0.01):
        pass


def train_until_stuck(model: Stuck) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(3):
        model.block = i == 2  # the third step gets stuck in the forward
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_seed_backtrace_is_the_training_thread_without_agent_frames(make_agent, capsys):
    # GIVEN training on its own thread, stuck inside a traced module's forward, while a
    # tqdm-like monitor thread runs
    agent = make_agent(trace="on")
    entered, release, stop = threading.Event(), threading.Event(), threading.Event()
    model = Stuck(entered, release)
    trainer = threading.Thread(target=train_until_stuck, args=(model,), name="trainer")
    monitor = threading.Thread(target=monitor_loop, args=(stop,), name="TMonitor")
    monitor.start()
    trainer.start()
    try:
        assert entered.wait(30), "training never reached the stuck forward"
        time.sleep(0.05)
        # WHEN the seed query runs
        seed = rows(agent, SEED)
        threads = rows(agent, "SELECT DISTINCT thread_name FROM python.backtrace")
        everyone = {r[0] for r in rows(agent, "SELECT DISTINCT thread_name FROM "
                                              "python.backtrace_all")}
        agent_frames = rows(agent, "SELECT count(*) FROM python.backtrace_all "
                                   "WHERE file LIKE '%/probe_agent/%'")
        code = main([agent.url.removeprefix("http://"), "--json", "backtrace"])
        out, err = capsys.readouterr()
    finally:
        release.set()
        stop.set()
        trainer.join(30)
        monitor.join(30)
    # THEN it is the training thread's stack, innermost first: the stuck forward, then the
    # module call, then the loop; no frame of the agent's (the tracer's call wrapper)
    assert threads == [["trainer"]]
    funcs = [r[0] for r in seed]
    assert funcs[:2] == ["wait", "forward"] or funcs[1:3] == ["wait", "forward"], seed
    assert "train_until_stuck" in funcs, seed
    assert [r[3] for r in seed] == list(range(len(seed)))
    assert not [r for r in seed if "probe_agent" in r[1]], seed
    # AND the other threads stay available in python.backtrace_all
    assert {"trainer", "TMonitor"} <= everyone  # (the querying thread counts as the agent)
    assert agent_frames == [[0]]
    # AND probe backtrace shows no agent frame either
    assert code == 0, err
    [body] = json.loads(out)
    shown = [f for t in body["threads"] if not t["is_agent"] for f in t["frames"]]
    assert shown and not [f for f in shown if "probe_agent" in f["file"]]
