"""Fan-out and client against real HTTP servers with canned agent bodies (tests/unit/cli_server).

Real sockets throughout: a closed port gives a real ConnectError, a sleeping handler a real
read timeout, a token check a real 401.
"""

from __future__ import annotations

import os
import socketserver
import threading

import pytest

from probe_cli.errors import (
    AgentTimeoutError,
    AgentUnreachableError,
    AuthError,
    UsageProblemError,
)
from probe_cli.transport.client import ProbeClient
from probe_cli.transport.fanout import resolve_ranks, run_on_ranks
from probe_cli.transport.session import Session
from probe_cli.transport.targets import Endpoint, parse_endpoints
from probe_protocol.routes import Route
from tests.unit.cli_server import CannedAgent, canned_job, closed_port


def session_for(*addresses: str, **kw) -> Session:
    return Session(endpoints=parse_endpoints(addresses, "/nonexistent"), **kw)


def test_one_target_reaches_every_rank_it_lists():
    with canned_job(4) as agents:
        # GIVEN a 4-rank job and only rank 2's address
        s = session_for(agents[2].address)
        # WHEN a request fans out
        results = run_on_ranks(s, ProbeClient.info)
        s.close()
    # THEN all four ranks answered, in rank order, each labelled with its own URL
    assert [r.rank for r in results] == [0, 1, 2, 3]
    assert all(r.ok for r in results)
    assert [r.url for r in results] == [a.url for a in agents]
    assert (results[1].host, results[1].pid) == ("node0", 1001)


def test_rank_filter_and_unknown_rank():
    with canned_job(4) as agents:
        s = session_for(agents[0].address, rank_filter=[1, 3])
        assert [r.rank for r in run_on_ranks(s, ProbeClient.info)] == [1, 3]
        # untouched ranks were never asked
        assert "GET /v1/info" not in agents[2].requests
        s.close()
        bad = session_for(agents[0].address, rank_filter=[9])
        with pytest.raises(UsageProblemError, match=r"rank 9 not in job \(ranks 0–3\)"):
            resolve_ranks(bad)
        bad.close()


def test_several_targets_are_exactly_those_agents_deduplicated():
    with canned_job(4) as agents:
        # GIVEN ranks 3 and 1 named explicitly, rank 1 twice under different spellings
        s = session_for(agents[3].address, agents[1].address, agents[1].url)
        results = run_on_ranks(s, ProbeClient.info)
        s.close()
    # THEN only those two ranks, once each, in rank order
    assert [r.rank for r in results] == [1, 3]


def test_unreachable_rank_is_a_failed_result_not_an_exception():
    # GIVEN a rank list that advertises a port nobody listens on for rank 1
    with canned_job(2) as agents:
        dead = f"http://127.0.0.1:{closed_port()}"
        for a in agents:
            a.peers[1] = {**a.peers[1], "url": dead}
        s = session_for(agents[0].address)
        # WHEN fanning out
        results = run_on_ranks(s, ProbeClient.info)
        s.close()
    # THEN rank 0 answered and rank 1 failed with the unreachable error and its remediation
    assert [r.ok for r in results] == [True, False]
    err = results[1].error
    assert isinstance(err, AgentUnreachableError)
    assert err.message == f"cannot reach agent at {dead}: connection refused."
    assert "PROBE_HOST" in err.help_text


def test_unreachable_single_target_fails_once_without_retrying():
    s = session_for(f"127.0.0.1:{closed_port()}")
    results = run_on_ranks(s, ProbeClient.info)
    s.close()
    assert len(results) == 1 and results[0].rank is None
    assert isinstance(results[0].error, AgentUnreachableError)


def test_silent_rank_times_out_and_the_rest_answer():
    # GIVEN rank 2 of 3 sits on every request for a long time
    with canned_job(3, overrides={2: {"delay": 30}}) as agents:
        # Its own /v1/ranks would time out too, so ask rank 0.
        s = session_for(agents[0].address, timeout=0.5)
        results = run_on_ranks(s, ProbeClient.eval, "1+1")
        s.close()
    assert [r.ok for r in results] == [True, True, False]
    assert results[2].silent and isinstance(results[2].error, AgentTimeoutError)
    assert results[2].error.message.endswith("did not answer within 0.5 s")


def test_wrong_token_is_an_auth_error_with_the_agents_body():
    with canned_job(1, token="s3cret") as agents:
        bad = ProbeClient(Endpoint(agents[0].url), token="nope", timeout=5)
        with pytest.raises(AuthError) as e:
            bad.info()
        bad.close()
        good = ProbeClient(Endpoint(agents[0].url), token="s3cret", timeout=5)
        assert good.info()["ok"] is True
        good.close()
    assert e.value.status == 401 and e.value.body["rank"] == 0
    assert "wrong token" in e.value.message


def test_http_error_keeps_the_body_on_the_result():
    with canned_job(2) as agents:
        s = session_for(agents[0].address)
        results = run_on_ranks(s, ProbeClient.eval, "1/0")
        s.close()
    assert not any(r.ok for r in results)
    assert all("ZeroDivisionError" in r.data["traceback"] for r in results)


def test_not_a_probe_agent_is_a_protocol_error():
    with canned_job(1) as agents:
        c = ProbeClient(Endpoint(agents[0].url), timeout=5)
        # A 404 body from the canned agent is a probe error body; a non-JSON answer is not.
        with pytest.raises(Exception) as e:
            c._json(Route("GET", "/nope", "a route no agent serves"))
        c.close()
    assert "HTTP 404" in str(e.value)


def test_unix_socket_target(tmp_path):
    """A PID target connects through the run dir's socket with base URL http://localhost, and
    the answering rank keeps that address (not the TCP URL it advertises)."""
    # GIVEN a canned agent served on <run_dir>/<our pid>.sock
    agent = CannedAgent(5)
    agent.server.server_close()  # only its handler is used, on a unix socket
    path = str(tmp_path / f"{os.getpid()}.sock")
    server = UnixHTTPServer(path, agent.server.RequestHandlerClass)
    t = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    t.start()
    try:
        # WHEN `probe PID info` resolves and fans out
        s = Session(endpoints=parse_endpoints([str(os.getpid())], str(tmp_path)))
        results = run_on_ranks(s, ProbeClient.info)
        s.close()
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)
    # THEN rank 5 answered over the socket
    assert [r.rank for r in results] == [5] and results[0].ok
    assert results[0].url == f"unix:{path}"


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):  # BaseHTTPRequestHandler logs a (host, port) client address
        sock, _ = super().get_request()
        return sock, ("unix", 0)


@pytest.mark.parametrize("discovery, says", [
    ({"state": "failing", "error": "ConnectionError: cannot connect to the c10d store at h:1"},
     "its agent cannot use the job's c10d store (ConnectionError: cannot connect"),
    ({"state": "waiting"}, "has not called init_process_group yet"),
    ({"state": "ok"}, "the others have not registered yet"),
])
def test_a_partial_rank_list_is_explained_with_what_to_do(discovery, says):
    from probe_cli.transport.fanout import _missing_ranks_note

    ep = Endpoint("http://node0:9700")
    body = {"rank": 0, "world_size": 8, "discovery": discovery}
    note = _missing_ranks_note(body, ep, {0, 1})
    assert note.startswith("only 2 of 8 ranks found through ") and says in note
    assert "-t HOST:PORT" in note
    # a complete list, or an older agent that does not say its world size, gets no note
    assert _missing_ranks_note({**body, "world_size": 2}, ep, {0, 1}) is None
    assert _missing_ranks_note({"rank": 0}, ep, {0}) is None
