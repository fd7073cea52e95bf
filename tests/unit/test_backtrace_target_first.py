"""`probe backtrace` does not make the target's own stack wait on discovery (issue 20).

A real HTTP server whose /v1/ranks never answers in time (an agent whose event loop is wedged
behind a watchdog that predates issue 20), and one that answers it slowly but in time.
"""

from __future__ import annotations

from typing import Any

from probe_cli.transport.fanout import fan_out_target_first
from probe_cli.transport.session import Session
from probe_cli.transport.targets import parse_endpoints
from tests.unit.cli_server import CannedAgent


class SlowDiscovery(CannedAgent):
    """Answers /v1/ranks after ``ranks_delay`` seconds (released at teardown); the rest at once."""

    def __init__(self, rank: int, ranks_delay: float) -> None:
        super().__init__(rank)
        self.ranks_delay = ranks_delay

    def answer(self, method: str, path: str, query: dict[str, list[str]],
               body: dict[str, Any] | None, auth: str) -> tuple[int, dict[str, Any]]:
        if path == "/v1/ranks":
            self.release.wait(self.ranks_delay)
        return super().answer(method, path, query, body, auth)


def _backtrace(agent: CannedAgent, timeout: float) -> tuple[list, list[str]]:
    """``probe backtrace``'s fan-out against ``agent``, started here and stopped after."""
    agent.start()
    s = Session(endpoints=parse_endpoints([agent.address], "/nonexistent"), timeout=timeout)
    try:
        return fan_out_target_first(s, lambda c, _: c.backtrace()), s.notes
    finally:
        s.close()
        agent.stop()


def test_target_answers_its_own_backtrace_when_discovery_times_out():
    # WHEN discovery does not answer within the timeout
    results, notes = _backtrace(SlowDiscovery(3, ranks_delay=30), timeout=1.0)
    # THEN the target's own backtrace is shown, with its rank, and a note says why it is alone
    assert [(r.rank, r.ok) for r in results] == [(3, True)], results
    assert results[0].data["threads"][0]["frames"][0]["func"] == "step"
    assert len(notes) == 1 and "did not list the job's ranks" in notes[0], notes


def test_slow_discovery_does_not_ask_the_target_twice():
    agent = SlowDiscovery(0, ranks_delay=0.3)
    results, notes = _backtrace(agent, timeout=5.0)
    assert [(r.rank, r.ok, r.pid) for r in results] == [(0, True, 1000)] and not notes
    assert sum(req.startswith("GET /v1/backtrace") for req in agent.requests) == 1, agent.requests
