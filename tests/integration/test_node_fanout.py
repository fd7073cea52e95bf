"""The per-node tree (probe_cli/transport/nodetree.py, the watchdog's node route) against
simulated ranks (tests/simranks.py: the real HTTP, access rule and node relay; fake training
processes): 3 nodes x 4 ranks in one process."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from probe_cli.main import main
from probe_cli.render.text import render_json, render_query_csv
from probe_cli.transport.fanout import resolve_ranks
from probe_cli.transport.nodetree import NodeCall, fan_out_nodes, stream_nodes
from probe_cli.transport.session import Session
from probe_cli.transport.targets import Endpoint
from probe_protocol import nodefan
from tests import simranks
from tests.foreign import FOREIGN_UID, http_request, need_root, run_as

WORLD, PER_NODE = 12, 4
TOKEN = "node-fanout-test-token"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Node 1's node route never answers; the job has a token."""
    root = tmp_path_factory.mktemp("sim")
    os.chmod(root, 0o700)
    token_file = root / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    base, procs = simranks.start(str(root), WORLD, PER_NODE, 1, token_file=str(token_file),
                                 stall=(1,))
    try:
        yield {"base": base, "root": root}
    finally:
        simranks.stop(procs)


def _tree(job: dict[str, Any], node: NodeCall, timeout: float = 1.0
          ) -> tuple[list[Any], list[int]]:
    """The tree's results, and the ranks it asked one by one."""
    direct: list[int] = []

    def call(client: Any, target: Any) -> dict[str, Any]:
        direct.append(target.rank)
        if node.route == "backtrace":
            return client.backtrace()
        return client.query(node.params["sql"])

    session = Session(endpoints=[Endpoint(f"http://127.0.0.1:{job['base']}")], token=TOKEN,
                      timeout=timeout)
    try:
        return fan_out_nodes(session, resolve_ranks(session), call, node), sorted(direct)
    finally:
        session.close()


def test_one_request_per_node_and_a_silent_node_rank_by_rank(job):
    # GIVEN 3 nodes of 4 ranks, node 1's node agent silent
    # WHEN the tree asks every rank for its backtrace
    results, direct = _tree(job, NodeCall("backtrace", {}))
    # THEN every rank answered with its own body, and only node 1's ranks were asked directly
    assert [r.rank for r in results if r.ok] == list(range(WORLD)), results
    assert direct == [4, 5, 6, 7]
    for r in results:
        assert r.data["rank"] == r.rank and r.data["host"] == f"sim-node{r.rank // PER_NODE}"
        main_frames = r.data["threads"][0]["frames"]
        assert isinstance(main_frames, list) and main_frames[0]["func"] in ("wrapper", "fetch")


def test_query_rows_come_back_per_rank(job):
    sql = "SELECT rank, count(*) AS frames FROM python.backtrace GROUP BY rank"
    results, direct = _tree(job, NodeCall("query", {"sql": sql}))
    assert direct == [4, 5, 6, 7]
    assert {r.rank: r.data["rows"] for r in results} == {r: [[r, 6]] for r in range(WORLD)}
    assert all(r.data["columns"] == ["rank", "frames"] for r in results)


def test_cli_backtrace_and_query_merge_across_nodes(job, capsys):
    target = f"127.0.0.1:{job['base']}"
    code = main(["-t", target, "--token", TOKEN, "--timeout", "1.0", "backtrace"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "rank 3 (1/12 ranks)" in out and "ranks 0–2,4–11 (11/12 ranks)" in out, out
    code = main(["-t", target, "--token", TOKEN, "--timeout", "1.0", "--json", "query",
                 "SELECT count(*) AS n FROM python.backtrace"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert sorted(b["rank"] for b in json.loads(out)) == list(range(WORLD))


def test_the_node_route_needs_the_callers_own_token(job):
    """Another uid on this machine reaches a rank through the node agent only with the token,
    and only the node agent's own ranks: the relay lends no authority of its own."""
    need_root()
    port = job["base"]  # rank 0: node 0's agent
    ask = nodefan.request("backtrace", {}, [0, 1, 2, 3, 4])
    without = run_as(FOREIGN_UID, http_request, "127.0.0.1", port, "POST",
                     "/v1/node/fanout", ask)
    wrong = run_as(FOREIGN_UID, http_request, "127.0.0.1", port, "POST", "/v1/node/fanout",
                   ask, {"Authorization": "Bearer nope"})
    right = run_as(FOREIGN_UID, http_request, "127.0.0.1", port, "POST", "/v1/node/fanout",
                   ask, {"Authorization": f"Bearer {TOKEN}"})
    assert without[0] == 401 and "missing token" in without[1]["error"]
    assert wrong[0] == 401 and "wrong token" in wrong[1]["error"]
    assert right[0] == 200, right
    got = {rank: status for rank, status, _ in nodefan.split(right[1])}
    # rank 4 lives on node 1: node 0's agent does not reach across to it
    assert got == {0: 200, 1: 200, 2: 200, 3: 200, 4: 0}


def test_hang_verdict_from_evidence_gathered_node_by_node(job, capsys):
    # GIVEN rank 3 in the DataLoader while the others wait in all_reduce #42 (node 1 silent
    # on the node route)
    code = main(["-t", f"127.0.0.1:{job['base']}", "--token", TOKEN, "--timeout", "1.0",
                 "hang"])
    out, err = capsys.readouterr()
    # THEN the verdict covers every rank, node 1's asked one by one
    assert code == 4, out + err
    assert "rank 3 never reached all_reduce #42; it is in the DataLoader" in out, out
    assert "11 ranks wait for it" in out, out


def test_query_answers_stream_in_rank_order_before_a_silent_node_is_retried(job):
    # GIVEN node 1's agent silent on the node route: its ranks 4-7 are asked one by one once
    # the node request times out (1 s)
    sql = "SELECT rank, count(*) AS frames FROM python.backtrace GROUP BY rank"
    node = NodeCall("query", {"sql": sql})
    events: list[tuple[str, int]] = []

    def call(client: Any, target: Any) -> dict[str, Any]:
        events.append(("asked", target.rank))
        return client.query(sql)

    session = Session(endpoints=[Endpoint(f"http://127.0.0.1:{job['base']}")], token=TOKEN,
                      timeout=1.0)
    try:
        # WHEN the answers are streamed
        streamed = []
        for r in stream_nodes(session, resolve_ranks(session), call, node):
            events.append(("out", r.rank))
            streamed.append(r)
        gathered = fan_out_nodes(session, resolve_ranks(session), call, node)
    finally:
        session.close()
    # THEN they are the gathered answers (but the query's own time), in the same order ...
    assert [(r.rank, r.ok, _untimed(r.data)) for r in streamed] == \
        [(r.rank, r.ok, _untimed(r.data)) for r in gathered]
    assert [r.rank for r in streamed] == list(range(WORLD))
    # ... and node 0's were handed out before node 1's ranks were even asked
    first_retry = events.index(("asked", 4))
    assert {("out", r) for r in range(4)} <= set(events[:first_retry]), events


@pytest.mark.parametrize("fmt", ["--json", "--csv"])
def test_cli_streamed_query_prints_what_the_gathered_answer_prints(job, capsys, fmt):
    sql = "SELECT rank, count(*) AS frames FROM python.backtrace GROUP BY rank"
    code = main(["-t", f"127.0.0.1:{job['base']}", "--token", TOKEN, "--timeout", "1.0", fmt,
                 "query", sql])
    out, err = capsys.readouterr()
    assert code == 0, err
    session = Session(endpoints=[Endpoint(f"http://127.0.0.1:{job['base']}")], token=TOKEN,
                      timeout=1.0)
    try:
        results = fan_out_nodes(session, resolve_ranks(session),
                                lambda client, _t: client.query(sql), NodeCall("query",
                                                                              {"sql": sql}))
    finally:
        session.close()
    # (the same text but each query's own time: one line per rank, "[" and "]" alone)
    if fmt == "--json":
        want = render_json(results)
        assert [_untimed(b) for b in json.loads(out)] == [_untimed(b) for b in json.loads(want)]
        assert [line[:20] for line in out.splitlines()] == [line[:20] for line in
                                                            want.splitlines()]
    else:
        assert out == "\n".join(render_query_csv(results)) + "\n"


def _untimed(body: dict[str, Any] | None) -> dict[str, Any] | None:
    return {k: v for k, v in body.items() if k != "elapsed_ms"} if body else body
