"""What each rank is asked for a verdict: the per-rank calls of `probe hang`, `probe doctor` and
`probe straggler`, shared with `probe ui` so the dashboard shows the verdicts the commands print
from the same evidence (one home for diagnosis). Each returns a ``fanout.Call``; the
verdicts themselves are computed by the pure modules of diagnose/.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from probe_protocol.bodies import BacktraceBody, CollectivesBody
from probe_protocol.envelope import Envelope
from probe_protocol.query import QueryBody

from ..diagnose.cpu_wait import RankCpu
from ..diagnose.doctor import evidence
from ..diagnose.hang import in_dataloader
from ..diagnose.levers import LEVER_EVIDENCE
from ..diagnose.straggler import StragglerVerdict, diagnose_stragglers
from ..errors import AgentHTTPError, RankError
from ..result import RankResult
from ..transport.fanout import Call, RankTarget
from ..transport.nodetree import NodeCall, fan_out_nodes
from ..transport.postmortem import NOT_RECORDED
from ..transport.rank_client import RankClient
from ..transport.session import Session

#: Recent collectives asked of each rank: enough to see the last done and every pending one.
RECENT = 64


def hang_evidence(client: RankClient, _: RankTarget) -> dict[str, Any]:
    bt = client.backtrace()
    if _waits_for_a_batch(bt):  # which worker it waits for (see _loader_children)
        bt = client.backtrace(children=True)
    who = Envelope.from_wire(bt)
    out: dict[str, Any] = {"ok": True, "rank": who.rank, "pid": who.pid, "host": who.host,
                           "backtrace": bt, "collectives": None}
    try:
        out["collectives"] = client.collectives(limit=RECENT)
    except RankError as e:
        # A rank whose GIL is held answers the backtrace from its watchdog (out of process)
        # but not the collectives: keep its stack, it is the verdict's evidence.
        out["collectives_error"] = e.reason
        out["collectives_heartbeat_age_s"] = _heartbeat_age(e)
    return out


def _heartbeat_age(error: Any) -> float | None:
    """How long the rank's Python had not run, from its watchdog's 504 (``heartbeat_age_s``);
    None when the error does not say (a timeout, no watchdog)."""
    body = getattr(error, "body", None)
    age = body.get("heartbeat_age_s") if isinstance(body, dict) else None
    return float(age) if isinstance(age, int | float) and not isinstance(age, bool) else None


def hang_evidence_by_node(session: Session, targets: list[RankTarget]) -> list[RankResult]:
    """``hang_evidence`` of every target, asked one node at a time (transport/nodetree.py): the
    stacks in one round, then the collectives of the ranks that answered, merged per rank into
    the same ``{"backtrace", "collectives"}`` body. Two rounds, not one per rank: a silent rank
    costs one timeout, and a rank's stack and collectives are read a round apart (a hang holds
    still; a job that moves on is no hang either way)."""
    stacks = fan_out_nodes(session, targets, lambda c, _: c.backtrace(),
                           NodeCall("backtrace", {}))
    answered = {r.url for r in stacks if r.ok}
    colls = fan_out_nodes(
        session, [t for t in targets if t.endpoint.label in answered],
        lambda c, _: c.collectives(limit=RECENT), NodeCall("collectives", {"limit": RECENT}))
    by_url = {r.url: r for r in colls}
    kids = _loader_children(session, targets, stacks)
    out = []
    for r in stacks:
        if not r.ok or r.data is None:
            out.append(r)
            continue
        who = Envelope.from_wire(r.data)
        bt = {**r.data, "children": kids[r.url]} if r.url in kids else r.data
        body: dict[str, Any] = {"ok": True, "rank": who.rank, "pid": who.pid, "host": who.host,
                                "backtrace": bt, "collectives": None}
        c = by_url.get(r.url)
        if c is not None and c.ok:
            body["collectives"] = c.data
        else:  # as hang_evidence: keep the stack (the watchdog's, with the GIL held)
            body["collectives_error"] = getattr(c and c.error, "reason", None) or "no answer"
            body["collectives_heartbeat_age_s"] = _heartbeat_age(c and c.error)
        out.append(replace(r, data=body))
    return out


def _waits_for_a_batch(body: dict[str, Any] | None) -> bool:
    main = BacktraceBody.from_wire(body).main_thread
    return in_dataloader(tuple((main or {}).get("frames") or ()))


def _loader_children(session: Session, targets: list[RankTarget],
                     stacks: list[RankResult]) -> dict[str, list[dict[str, Any]]]:
    """The children (DataLoader workers) of each rank whose main thread waits for a batch, as
    its watchdog reads them from outside (``?children=1``), by url: a third round, for those
    ranks only (py-spy pauses each worker for a moment). A rank with no watchdog sends none."""
    urls = {r.url for r in stacks if r.ok and _waits_for_a_batch(r.data)}
    if not urls:
        return {}
    again = fan_out_nodes(session, [t for t in targets if t.endpoint.label in urls],
                          lambda c, _: c.backtrace(children=True),
                          NodeCall("backtrace", {"children": 1}))
    return {r.url: list(BacktraceBody.from_wire(r.data).children or ())
            for r in again if r.ok and BacktraceBody.from_wire(r.data).children is not None}


def doctor_queries(last: int) -> tuple[tuple[str, str, dict[str, Any]], ...]:
    """(key, canned query, params): what each rank is asked in the second round, the evidence
    the checks declare (diagnose/checks.py). Memory growth and the slowest modules are the
    queries `probe memory` and `probe slow` run, so the commands cannot disagree with doctor;
    doctor only picks the window (``last``, the look-back every canned query takes)."""
    return tuple((e.key, e.query, e.params(last)) for e in evidence())


def lever_answers(client: RankClient, last: int) -> dict[str, list[dict[str, Any]] | None]:
    """What the throughput lever reads beside the throughput row (levers.LEVER_EVIDENCE: host
    syncs, compile state, the slowest modules, the measured step's work per module), for
    `probe throughput`; doctor asks the same through its checks' evidence. A query this agent
    does not have answers None (an older agent: the lever as before)."""
    out: dict[str, list[dict[str, Any]] | None] = {}
    for e in LEVER_EVIDENCE:
        try:
            out[e.key] = QueryBody.from_wire(client.canned(e.query, **e.params(last))).records()
        except RankError:
            out[e.key] = None
    return out


def doctor_evidence(last: int, grad_wait: float) -> Call:
    def call(client: RankClient, target: RankTarget) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": True, "rank": target.rank, "errors": {}}
        try:
            out["state"] = client.doctor()
        except RankError as e:
            out["errors"]["state"] = e.reason
        if out.get("state") is not None:
            try:
                out["grads"] = client.doctor_grads(grad_wait)
            except RankError as e:
                out["errors"]["grads"] = e.reason
        try:
            # The straggler and collective-wait checks want more history than the hang
            # round's RECENT: the collectives of about ``last`` steps, as `probe straggler`.
            coll = CollectivesBody.from_wire(client.collectives(limit=min(10_000, 4 * last)))
            out["collectives"] = list(coll.collectives)
            out["cpu"] = cpu_window(client, out["collectives"])
        except RankError as e:
            out["errors"]["collectives"] = e.reason
        for key, name, params in doctor_queries(last):
            try:
                body = client.canned(name, **params)
                out[key] = QueryBody.from_wire(body).records()
            except RankError as e:
                out["errors"][key] = _short(e)
        return out

    return call


def _short(e: RankError) -> str:
    """Why a rank gave no rows for one piece of evidence, in one line. A query the agent does
    not know (404: an agent older than this CLI) or a table a post-mortem copy does not hold
    (the reader's own ``NOT_RECORDED``, with the copy's format when it differs) is "not
    recorded", never a failed rank; anything else is its first line."""
    if isinstance(e, AgentHTTPError) and e.status == 404:
        return "not recorded by this agent version"
    if e.reason.startswith(NOT_RECORDED):
        return e.reason
    msg = getattr(e, "body", {}).get("error") if hasattr(e, "body") else None
    return str(msg or e.reason).split("\n")[0][:160]


def cpu_window(client: RankClient, collectives: list[dict[str, Any]] | tuple[Any, ...]
               ) -> list[dict[str, Any]] | None:
    """The rank's CPU time over the steps since the oldest of ``collectives`` (the
    ``cpu_window`` query): the CPU wait the straggler verdict weighs must cover the window
    whose arrivals it judges (a fixed step count did not: at 1 collective a step, 200
    collectives span 200 steps, and a rank that had waited for a CPU 42% of the time until 50
    steps ago showed 11%, and was named). None when there are none, or the agent has no such
    query (older: the verdict reads straggler_steps' share)."""
    starts = [float(t) for c in collectives if isinstance(t := c.get("start_time"), (int, float))]
    if not starts:
        return None
    try:
        return QueryBody.from_wire(client.canned("cpu_window", since=min(starts))).records()
    except RankError:
        return None


def straggler_evidence(last: int) -> Call:
    def call(client: RankClient, _: RankTarget) -> dict[str, Any]:
        coll = client.collectives(limit=min(10_000, 4 * last))
        try:
            steps: dict[str, Any] | None = client.canned("straggler_steps", last=last)
        except RankError:  # python.steps not recorded by this agent (tracing not built/on)
            steps = None
        try:
            work = QueryBody.from_wire(client.canned("rank_work", last=last)).records()
        except RankError:  # an older agent: the verdict stands without the why
            work = []
        rank = Envelope.from_wire(coll).rank
        cpu = cpu_window(client, CollectivesBody.from_wire(coll).collectives)
        return {"ok": True, "rank": rank, "collectives": coll, "steps": steps,
                "work": work[0] if work else None, "cpu": cpu[0] if cpu else None}

    return call


def straggler_verdict(results: list[RankResult], last: int,
                      min_share: float) -> tuple[StragglerVerdict, dict[int, dict[str, Any]]]:
    """``straggler_evidence`` answers -> the verdict, and each rank's ``straggler_steps`` body
    (for the step split the command prints). The ranks' median step time bounds the samples
    (diagnose_stragglers' ``step_s``)."""
    data = {r.rank: r.data for r in results if r.ok and r.data and r.rank is not None}
    bodies = {k: CollectivesBody.from_wire(d["collectives"]) for k, d in data.items()}
    rows = {k: list(b.collectives) for k, b in bodies.items()}
    now = {k: b.now for k, b in bodies.items() if b.now}
    steps = {k: d["steps"] for k, d in data.items() if d.get("steps")}
    step_ms = [rec.get("step_ms") for b in steps.values()
               for rec in QueryBody.from_wire(b).records()]
    known = [float(x) for x in step_ms if isinstance(x, (int, float)) and x > 0]
    step_s = statistics.median(known) / 1e3 if known else None
    cpu_wait: dict[int, float | RankCpu] = {}
    for k, d in data.items():  # over the arrivals' window; an older agent: straggler_steps'
        recs = [d["cpu"]] if d.get("cpu") else \
            QueryBody.from_wire(steps[k]).records() if k in steps else []
        if recs and (c := RankCpu.from_row(recs[0])) is not None:
            cpu_wait[k] = c
    work = {k: d["work"] for k, d in data.items() if d.get("work")}
    return diagnose_stragglers(rows, last=last, min_share=min_share, step_s=step_s,
                               now_by_rank=now, cpu_wait=cpu_wait, work=work), steps
