"""Fan-out through one agent per node: a two-level tree instead of one request per rank.

The ranks that discovery places on one host are asked in one ``POST /v1/node/fanout`` to the
lowest of them (its watchdog asks the others over their unix sockets and merges the answers,
probe_agent/watchdog/nodefan.py). The CLI then holds one connection per node, not per rank, and
decodes one body per node, whose stacks are sent once per distinct stack.

Fallbacks, so the tree never answers less than the flat fan-out:

- a node whose agent does not answer the node route (silent, dead, an agent without a watchdog
  or an older one: 404) has its ranks asked one by one, as ``fanout.fan_out`` does;
- a rank the node agent could not reach (``status`` 0) is asked directly too;
- ranks alone on their host, or without a host, and post-mortem copies go the flat way.

A rank's answer through its node is the same body it sends directly (``nodefan.split``), so
renderers and ``--json`` cannot tell the two paths apart.

``stream_nodes`` hands the answers out in rank order as soon as every lower rank has answered,
so a command that prints rank by rank (``probe query --json``/``--csv``) holds only the answers
that arrived ahead of a slower lower rank, not the whole job's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from probe_protocol import nodefan
from probe_protocol.envelope import Envelope

from ..errors import ProbeCLIError, ProtocolError, RankError, http_error_class
from ..result import RankResult, result_order
from .fanout import (
    FANOUT_CONCURRENCY,
    Call,
    RankTarget,
    call_one,
    failed_result,
    fan_out,
    parallel_map,
)
from .session import Session

#: The node agent gets this share of the CLI's timeout for each rank, so that it answers (with
#: the slow ranks marked) before the CLI gives up on the whole node.
NODE_SHARE = 0.8

#: Rows the streamed fan-out holds at most (about 25-60 MiB of decoded rows), and the requests
#: it sends before the first answer tells it how many rows a rank returns (stream_nodes).
ROW_BUDGET = 100_000
FIRST_WAVE = 4


@dataclass(frozen=True, slots=True)
class NodeCall:
    """What each rank is asked through its node: ``route`` in ``nodefan.NODE_ROUTES`` and its
    parameters (the backtrace's flags, or the query's ``{"sql", "max_rows"}``)."""

    route: str
    params: dict[str, Any] = field(default_factory=dict)


def fan_out_nodes(session: Session, targets: list[RankTarget], call: Call,
                  node: NodeCall) -> list[RankResult]:
    """``fan_out``'s answer, asked one node at a time where a host has two ranks or more.

    Args:
        call: the per-rank request, used for every rank the tree does not cover.
        node: the same request, as the node route carries it.
    """
    groups, flat = _plan(targets)
    results: list[RankResult] = []
    for done, retry in parallel_map(session, groups, lambda g: _ask_node(session, g, node)):
        results.extend(done)
        flat.extend(retry)
    if flat:
        results.extend(fan_out(session, flat, call))
    session.progress(len(results), len(results))
    return sorted(results, key=result_order)


def _plan(targets: list[RankTarget]) -> tuple[list[list[RankTarget]], list[RankTarget]]:
    """The node groups (two ranks or more on one host, at most ``MAX_NODE_RANKS`` each) and
    the ranks asked directly."""
    by_host: dict[str, list[RankTarget]] = {}
    flat: list[RankTarget] = []
    for t in targets:
        if (t.error is None and t.host and t.rank is not None
                and t.endpoint.postmortem is None):
            by_host.setdefault(t.host, []).append(t)
        else:
            flat.append(t)
    groups = []
    for ranks in by_host.values():
        if len(ranks) < 2:
            flat.extend(ranks)
            continue
        for lo in range(0, len(ranks), nodefan.MAX_NODE_RANKS):
            groups.append(ranks[lo:lo + nodefan.MAX_NODE_RANKS])
    return groups, flat


def stream_nodes(session: Session, targets: list[RankTarget], call: Call,
                 node: NodeCall) -> Iterator[RankResult]:
    """``fan_out_nodes``'s answers one by one, in the same (rank) order, each as soon as every
    lower rank's has come: a retried node's ranks are asked the moment its node fails.

    Nodes are asked lowest ranks first, and only while the rows held (answered but not yet
    handed out, plus what the requests in flight are expected to bring at the rows per rank
    seen so far) stay under ``ROW_BUDGET``; until a first answer says how big they are, only
    ``FIRST_WAVE`` requests go out. So a reader slower than the ranks (printing a million
    rows) holds a bounded share of the job's answer, and a small query still goes out
    ``FANOUT_CONCURRENCY`` requests at a time. Targets whose rank discovery could not tell (or
    a rank listed twice) leave no order to keep: then the whole answer is gathered first.
    """
    order = sorted(t.rank for t in targets if t.rank is not None)
    if len(order) != len(targets) or len(set(order)) != len(order):
        yield from fan_out_nodes(session, targets, call, node)
        return
    groups, flat = _plan(targets)

    def rank(t: RankTarget) -> int:
        return t.rank if t.rank is not None else -1  # (never -1: every target has one, above)

    todo = deque(sorted([(min(rank(t) for t in g), g) for g in groups]
                        + [(rank(t), [t]) for t in flat], key=lambda u: u[0]))
    # rank -> (answer, its rows); None: an answer that came back under no rank (handed out last)
    arrived: dict[int | None, tuple[RankResult, int]] = {}
    pending: dict[Future[Any], int] = {}  # -> ranks it covers (0: a rank retried directly)
    nxt, held, seen_rows, seen_ranks = 0, 0, 0, 0
    pool = ThreadPoolExecutor(FANOUT_CONCURRENCY, "probe-fanout")

    def take(r: RankResult) -> None:
        nonlocal held, seen_rows, seen_ranks
        rows = (r.data or {}).get("rows") if r.ok else None
        n = len(rows) if isinstance(rows, list) else 1
        arrived[r.rank] = (r, n)
        held, seen_rows, seen_ranks = held + n, seen_rows + n, seen_ranks + 1

    def ask(t: RankTarget) -> None:  # a retried rank: now, whatever the budget (it is next)
        if t.error is not None:
            take(failed_result(t, t.error))
        else:
            pending[pool.submit(call_one, session, t, call)] = 0

    def room() -> bool:
        if not pending:
            return True  # always one request out, or nothing would move
        if not seen_ranks:
            return len(pending) < FIRST_WAVE
        expected = sum(pending.values()) * seen_rows / seen_ranks
        return len(pending) < FANOUT_CONCURRENCY and held + expected < ROW_BUDGET

    try:
        while True:
            while todo and room():
                _, unit = todo.popleft()
                if len(unit) > 1:
                    pending[pool.submit(_ask_node, session, unit, node)] = len(unit)
                elif unit[0].error is not None:
                    take(failed_result(unit[0], unit[0].error))
                else:
                    pending[pool.submit(call_one, session, unit[0], call)] = 1
            while nxt < len(order) and order[nxt] in arrived:
                r, n = arrived.pop(order[nxt])
                held -= n
                nxt += 1
                session.progress(nxt, len(order))
                yield r
            if not pending and not todo:
                break
            if not pending:
                continue
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                if pending.pop(fut) > 1:
                    answered, retry = fut.result()
                    for r in answered:
                        take(r)
                    for t in retry:
                        ask(t)
                else:
                    take(fut.result())
        # (none are left unless an answer came back under another rank than asked: never
        # dropped, handed out last)
        yield from sorted((r for r, _ in arrived.values()), key=result_order)
    finally:
        # Ctrl-C, or a reader that stops early, must not wait for queued ranks
        pool.shutdown(wait=False, cancel_futures=True)


def _ask_node(session: Session, group: list[RankTarget], node: NodeCall
              ) -> tuple[list[RankResult], list[RankTarget]]:
    """The group's answers through its lowest rank, and the ranks to ask directly."""
    agent = min(group, key=lambda t: t.rank or 0)
    params = {**node.params, "timeout_s": round(session.timeout * NODE_SHARE, 3)}
    try:
        body = session.live_client(agent.endpoint, "node_fanout").node_fanout(
            nodefan.request(node.route, params, (t.rank for t in group if t.rank is not None)))
    except ProbeCLIError:
        return [], group  # a silent node: its ranks are asked one by one
    answers = {rank: (status, b) for rank, status, b in nodefan.split(body)}
    done, retry = [], []
    for t in group:
        got = answers.get(t.rank) if t.rank is not None else None
        if got is None or got[0] == 0:
            retry.append(t)
        else:
            done.append(_result(t, agent, *got))
    return done, retry


def _result(t: RankTarget, via: RankTarget, status: int, data: dict[str, Any]) -> RankResult:
    """The rank's answer, as ``fanout`` would have made it from a direct request."""
    url = t.endpoint.label
    env = Envelope.from_wire(data)
    host, pid = t.host or env.host, t.pid or env.pid
    err: RankError
    if status >= 400:
        error = str(data.get("error") or f"HTTP {status}")
        err = http_error_class(status)(
            f"agent at {url} answered HTTP {status}: {error}",
            url=url, reason=f"HTTP {status}: {error}", status=status, body=data)
        return RankResult(t.rank, url, False, data, err, host, pid)
    if env.ok is not True:
        msg = env.error or "the agent answered ok: false"
        err = ProtocolError(f"agent at {url}: {msg}", url=url, reason=msg)
        return RankResult(t.rank, url, False, data, err, host, pid)
    return RankResult(t.rank, url, True, data, None, host, pid)
