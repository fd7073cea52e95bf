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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from probe_protocol import nodefan
from probe_protocol.envelope import Envelope

from ..errors import ProbeCLIError, ProtocolError, http_error_class
from ..result import RankResult, result_order
from .fanout import Call, RankTarget, fan_out, parallel_map
from .session import Session

#: The node agent gets this share of the CLI's timeout for each rank, so that it answers (with
#: the slow ranks marked) before the CLI gives up on the whole node.
NODE_SHARE = 0.8


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
    results: list[RankResult] = []
    for done, retry in parallel_map(session, groups, lambda g: _ask_node(session, g, node)):
        results.extend(done)
        flat.extend(retry)
    if flat:
        results.extend(fan_out(session, flat, call))
    session.progress(len(results), len(results))
    return sorted(results, key=result_order)


def _ask_node(session: Session, group: list[RankTarget], node: NodeCall
              ) -> tuple[list[RankResult], list[RankTarget]]:
    """The group's answers through its lowest rank, and the ranks to ask directly."""
    agent = min(group, key=lambda t: t.rank or 0)
    params = {**node.params, "timeout_s": round(session.timeout * NODE_SHARE, 3)}
    try:
        body = session.client(agent.endpoint).node_fanout(
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
