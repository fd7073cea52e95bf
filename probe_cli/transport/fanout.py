"""Targets -> ranks -> one concurrent request per rank -> ``list[RankResult]`` in rank order.

Rank discovery (``resolve_ranks``):

- one target: ``GET /v1/ranks`` on it and reach every rank listed, each at its advertised URL,
  except the answering rank itself, which keeps the address the operator gave (a PID's unix
  socket stays a unix socket; a host reached through a tunnel stays reachable). If the route
  fails with an HTTP error the target alone is used; if the target cannot be reached at all it
  becomes one failed result (no second wait on a dead address).
- several targets (``-t a,b``, ``--hostfile``): exactly those agents, each asked for its rank,
  duplicates (the same rank twice) dropped.
- ``--rank`` then filters; naming a rank the job does not have is a usage error.

``fan_out_target_first`` (``probe backtrace``) sends the single target its own request beside
discovery, not after it: a rank whose ``/v1/ranks`` is slow (a wedged event loop) still
answers its own backtrace, and its watchdog's cached rank list reaches the others.

Fan-out (``fan_out``) never raises for a rank: each becomes a ``RankResult`` with the wire body
or the error (torch.distributed.debug's ``fetch_all``). At most ``FANOUT_CONCURRENCY`` requests
are in flight; each rank gets ``session.timeout`` seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Any, Concatenate, ParamSpec, TypeVar

from probe_protocol.bodies import InfoBody, RanksBody
from probe_protocol.envelope import Envelope

from ..errors import (
    AgentHTTPError,
    AgentTimeoutError,
    AgentUnreachableError,
    AuthError,
    ForbiddenError,
    ProbeCLIError,
    ProtocolError,
    RankError,
    UntrustedAgentError,
    UsageProblemError,
)
from ..group import compact_ranges
from ..result import RankResult, result_order
from .client import ProbeClient
from .rank_client import RankClient, live
from .session import Session
from .targets import Endpoint, default_run_dir
from .trust import rank_entry_problem
from .unjoined import find_unjoined

#: Requests in flight at once. 64 keeps a 512-rank job to 8 waves of short requests while
#: staying far below a login node's file-descriptor limit.
FANOUT_CONCURRENCY = 64

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RankTarget:
    """One rank to ask. ``rank`` is None when discovery could not say (the answer will).

    ``error`` is set when discovery already showed the agent cannot answer (unreachable,
    silent, wrong token): the fan-out reports it without asking again.
    """

    rank: int | None
    endpoint: Endpoint
    host: str | None = None
    pid: int | None = None
    error: RankError | None = None


# -- discovery ------------------------------------------------------------------------------


def resolve_ranks(session: Session) -> list[RankTarget]:
    """The ranks this invocation reaches (discovered once per session, then cached)."""
    if session.rank_cache is None:
        if session.endpoints[0].postmortem is not None:
            targets = _postmortem_ranks(session.endpoints[0])
        elif len(session.endpoints) == 1:
            targets = _expand(session, session.endpoints[0])
        else:
            targets = _dedupe(
                parallel_map(session, session.endpoints, lambda ep: _identify(session, ep))
            )
        session.rank_cache = _filter(targets, session.rank_filter)
    return list(session.rank_cache)


def _postmortem_ranks(ep: Endpoint) -> list[RankTarget]:
    """A post-mortem copy's ranks (transport/postmortem.py); one without a directory is a
    failed rank, listed like a silent one."""
    from .postmortem import PREFIX, find_job

    job = find_job(ep.postmortem or "")
    out = [RankTarget(r, Endpoint(PREFIX + c.path, postmortem=c.path),
                      c.meta.get("host"), c.meta.get("pid")) for r, c in sorted(job.ranks.items())]
    for r in job.missing:
        label = f"{PREFIX}{job.path}/rank-{r}"
        out.append(RankTarget(r, Endpoint(label), error=RankError(
            f"rank {r} left no post-mortem directory in {job.path}", url=label,
            reason="no post-mortem directory")))
    return out


_NO_ANSWER = (AgentUnreachableError, AgentTimeoutError, AuthError, ForbiddenError,
              UntrustedAgentError)


def _expand(session: Session, ep: Endpoint) -> list[RankTarget]:
    try:
        raw = session.live_client(ep, "ranks").ranks()
    except _NO_ANSWER as e:
        return [RankTarget(None, ep, error=e)]
    except RankError:
        return [RankTarget(None, ep)]  # an agent without /v1/ranks: ask the target itself
    body = RanksBody.from_wire(raw)
    me = body.rank
    # The list comes from the job's c10d store, which anyone who reaches it can write: each
    # entry must carry the token's signature before its URL gets the token or code.
    raws = {e.get("rank"): e for e in raw.get("ranks") or () if isinstance(e, dict)}
    out: list[RankTarget] = []
    for entry in body.ranks:
        rank = entry.rank
        problem = rank_entry_problem(raws.get(rank) or {}, session.token)
        if rank == me:
            out.append(RankTarget(rank, ep, entry.host, entry.pid))
        elif problem is not None:
            label = entry.url or f"rank {rank}"
            fix = ("someone may have rewritten the job's rank list; reach that rank with -t "
                   "HOST:PORT, or check who can reach the c10d store's port")
            if session.token is None:
                fix += "; a job with ranks on other machines needs a token (PROBE_TOKEN)"
            err: RankError = UntrustedAgentError(
                f"rank {rank} dropped: {problem}; nothing was sent to {label}", url=label,
                reason=f"dropped: {problem}", help_text=fix)
            out.append(RankTarget(rank, Endpoint(label), entry.host, entry.pid, error=err))
        elif entry.url:
            # Without a token, the socket reached must be on this machine too (guard.py).
            where = Endpoint(entry.url.rstrip("/"), this_machine_only=session.token is None)
            out.append(RankTarget(rank, where, entry.host, entry.pid))
        else:
            why = f"rank {rank} advertised no URL in {ep.label}/v1/ranks"
            err = ProtocolError(why, url=f"rank {rank}", reason="no URL advertised")
            out.append(RankTarget(rank, Endpoint("http://unknown"), error=err))
    if me is not None and all(t.rank != me for t in out):
        out.append(RankTarget(me, ep))
    found = {t.rank for t in out}
    missing = sorted(set(range(body.world_size or 0)) - found)
    if missing:  # up on this machine but never joined (transport/unjoined.py)
        for rank, where in _unjoined(session, ep, missing).items():
            out.append(RankTarget(rank, where, pid=where.pid))
            session.unjoined[rank] = where.pid or 0
        found = {t.rank for t in out}
    note = _missing_ranks_note(body, ep, found)
    if note:
        session.notes.append(note)
        # A rank the job has but the CLI cannot reach is silent: it is reported with the others
        # that did not answer, and the exit code says the answer is partial (3), as promised.
        for rank in sorted(set(range(body.world_size or 0)) - found):
            err = AgentUnreachableError(
                f"rank {rank} is in the job (world size {body.world_size}) but not in "
                f"{ep.label}'s rank list: it was not asked", url=f"rank {rank}",
                reason="not registered: no address known",
                help_text="pass every rank's agent with -t HOST:PORT,HOST:PORT or --hostfile")
            out.append(RankTarget(rank, Endpoint(f"http://rank-{rank}.unregistered"),
                                  error=err))
    return _dedupe(out) or [RankTarget(None, ep)]


def _unjoined(session: Session, ep: Endpoint, missing: list[int]) -> dict[int, Endpoint]:
    try:
        me = InfoBody.from_wire(session.client(ep).info())
    except RankError:
        return {}
    return find_unjoined(session.run_dir or default_run_dir(), me, missing)


def _missing_ranks_note(body: RanksBody | dict[str, Any], ep: Endpoint,
                        found: set[int | None]) -> str | None:
    """Say so when the answering agent knows fewer ranks than the job has, and why: a user who
    sees 1 rank of a 64-rank job must not take it for the whole job.

    Args:
        body: the ``GET /v1/ranks`` answer, typed or as it came.
    """
    if not isinstance(body, RanksBody):
        body = RanksBody.from_wire(body)
    world = body.world_size
    if world is None or len(found) >= world:
        return None
    disc = body.discovery
    head = f"only {len(found)} of {world} ranks found through {ep.label}"
    fix = "pass every rank's agent with -t HOST:PORT,HOST:PORT or --hostfile"
    if disc.get("state") == "failing":
        return f"{head}: its agent cannot use the job's c10d store ({disc.get('error')}); {fix}"
    if disc.get("state") == "waiting":
        return (f"{head}: the job has not called init_process_group yet, so ranks have not "
                f"registered; run again once it has, or {fix}")
    return f"{head}: the others have not registered yet; run again in a moment, or {fix}"


def _identify(session: Session, ep: Endpoint) -> RankTarget:
    try:
        body = RanksBody.from_wire(session.live_client(ep, "ranks").ranks())
    except _NO_ANSWER as e:
        return RankTarget(None, ep, error=e)
    except RankError:
        return RankTarget(None, ep)
    if body.rank is None:
        return RankTarget(None, ep)
    entry = body.entry(body.rank)
    return RankTarget(body.rank, ep, entry.host if entry else None, entry.pid if entry else None)


def _dedupe(targets: list[RankTarget]) -> list[RankTarget]:
    seen: set[int] = set()
    out = []
    for t in targets:
        if t.rank is not None:
            if t.rank in seen:
                continue
            seen.add(t.rank)
        out.append(t)
    return sorted(out, key=lambda t: (t.rank is None, t.rank or 0))


def _filter(targets: list[RankTarget], wanted: list[int] | None) -> list[RankTarget]:
    if not wanted:
        return targets
    known = sorted(t.rank for t in targets if t.rank is not None)
    missing = sorted(set(wanted) - set(known))
    undiscovered = any(t.rank is None for t in targets)
    if missing and not undiscovered:
        noun = "rank" if len(missing) == 1 else "ranks"
        job = f"ranks {compact_ranges(known)}" if known else "no ranks"
        raise UsageProblemError(
            f"{noun} {compact_ranges(missing)} not in job ({job})",
            help_text="`probe info` lists the ranks; --rank takes lists like 0,3 or 0-7",
        )
    return [t for t in targets if t.rank is None or t.rank in wanted]


# -- fan-out --------------------------------------------------------------------------------


def parallel_map(session: Session, items: list[Any], fn: Callable[[Any], T]) -> list[T]:
    """``fn`` over ``items`` on at most FANOUT_CONCURRENCY threads, results in input order."""
    if len(items) <= 1:
        return [fn(i) for i in items]
    pool = ThreadPoolExecutor(min(FANOUT_CONCURRENCY, len(items)), "probe-fanout")
    try:
        return list(pool.map(fn, items))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


#: One rank's request: given its client (live, or a post-mortem copy's reader) and target, the
#: wire body. A call that needs a live rank gets its ``ProbeClient`` through ``live``.
Call = Callable[[RankClient, RankTarget], dict[str, Any]]
P = ParamSpec("P")


def fan_out(session: Session, targets: list[RankTarget], call: Call) -> list[RankResult]:
    """Run ``call(client, target)`` for every target concurrently; never raises for a rank.

    Args:
        call: sends one request and returns the wire body; ``ProbeCLIError`` it raises
            becomes that rank's failure. Any other exception is a bug and propagates.
    """
    results = [failed_result(t, t.error) for t in targets if t.error is not None]
    todo = [t for t in targets if t.error is None]
    total = len(targets)
    session.progress(len(results), total)
    if todo:
        pool = ThreadPoolExecutor(min(FANOUT_CONCURRENCY, len(todo)), "probe-fanout")
        try:
            futures: list[Future[RankResult]] = [
                pool.submit(call_one, session, t, call) for t in todo
            ]
            for fut in as_completed(futures):
                results.append(fut.result())
                session.progress(len(results), total)
        finally:
            # Ctrl-C must not wait for queued ranks; running ones end within the timeout.
            pool.shutdown(wait=False, cancel_futures=True)
    wanted = session.rank_filter
    if wanted:  # a target whose rank discovery could not tell: keep it only if it is wanted
        results = [r for r in results if r.rank is None or r.rank in wanted]
    return sorted(results, key=result_order)


Spread = Callable[[Session, list[RankTarget], Call], list[RankResult]]


def fan_out_target_first(session: Session, call: Call, spread: Spread | None = None
                         ) -> list[RankResult]:
    """``fan_out`` over ``resolve_ranks``, except that with one target and nothing discovered
    yet, the target's own ``call`` runs concurrently with discovery and is used for its rank
    whatever discovery does (the others are reached once discovery lists them).

    Args:
        spread: how the ranks are asked (``fan_out`` by default; nodetree.py's per-node tree).
    """
    spread = spread or fan_out
    if (len(session.endpoints) != 1 or session.rank_cache is not None
            or session.endpoints[0].postmortem is not None):
        return spread(session, resolve_ranks(session), call)
    ep = session.endpoints[0]
    pool = ThreadPoolExecutor(1, "probe-fanout-target")
    try:
        early = pool.submit(call_one, session, RankTarget(None, ep), call)
        targets = resolve_ranks(session)
        others = [t for t in targets if t.endpoint != ep]
        mine = next((t for t in targets if t.endpoint == ep), None)
        results = spread(session, others, call) if others else []
        if mine is None and others:
            return results  # --rank left the target's own rank out
        own = early.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if mine is not None and mine.error is not None and own.ok:
        session.notes.append(f"{ep.label} did not list the job's ranks ({mine.error.message}); "
                             "showing its own rank only: pass every rank with -t or --hostfile")
    if mine is not None:
        own = replace(own, rank=own.rank if own.rank is not None else mine.rank,
                      host=own.host or mine.host, pid=own.pid or mine.pid)
    results.append(own)
    wanted = session.rank_filter
    if wanted:
        results = [r for r in results if r.rank is None or r.rank in wanted]
    return sorted(results, key=result_order)


def calling(method: Callable[Concatenate[RankClient, P], dict[str, Any]],
            *args: P.args, **kwargs: P.kwargs) -> Call:
    """A fan-out call from a ``RankClient`` method (one a post-mortem copy answers too) and its
    arguments: ``calling(RankClient.canned, "slow_modules", steps=20)`` sends that on every
    rank. A live-only method is a type error here: ``calling_live``."""
    # By name: the protocol's method is a stub; each client class answers it its own way.
    name = method.__name__
    return lambda client, _target: getattr(client, name)(*args, **kwargs)


def calling_live(method: Callable[Concatenate[ProbeClient, P], dict[str, Any]],
                 *args: P.args, **kwargs: P.kwargs) -> Call:
    """``calling`` for a ``ProbeClient`` method only a live rank answers (``step``, actions,
    eval): a post-mortem copy's rank fails with a line saying a live rank is needed."""
    name = method.__name__
    return lambda client, _target: method(live(client, name), *args, **kwargs)


def run_on_ranks(session: Session, method: Callable[Concatenate[RankClient, P], dict[str, Any]],
                 *args: P.args, **kwargs: P.kwargs) -> list[RankResult]:
    """The shared pipeline's first half: resolve the ranks and call one ``RankClient``
    method (``RankClient.info``) with these arguments on each."""
    return fan_out(session, resolve_ranks(session), calling(method, *args, **kwargs))


def run_live_on_ranks(session: Session,
                      method: Callable[Concatenate[ProbeClient, P], dict[str, Any]],
                      *args: P.args, **kwargs: P.kwargs) -> list[RankResult]:
    """``run_on_ranks`` for a live-only ``ProbeClient`` method (``calling_live``)."""
    return fan_out(session, resolve_ranks(session), calling_live(method, *args, **kwargs))


def call_one(session: Session, target: RankTarget, call: Call) -> RankResult:
    """One rank's ``call`` as a ``RankResult``; a ``ProbeCLIError`` becomes its failure."""
    try:
        data = call(session.client(target.endpoint), target)
    except ProbeCLIError as e:
        return failed_result(target, e)
    env = Envelope.from_wire(data)
    rank = target.rank if target.rank is not None else env.rank
    host = target.host or env.host
    pid = target.pid or env.pid
    if env.ok is False:  # an error body behind a 2xx status: still a failure
        msg = env.error or "the agent answered ok: false"
        err = ProtocolError(
            f"agent at {target.endpoint.label}: {msg}", url=target.endpoint.label, reason=msg
        )
        return RankResult(rank, target.endpoint.label, False, data, err, host, pid)
    return RankResult(rank, target.endpoint.label, True, data, None, host, pid)


def failed_result(target: RankTarget, error: ProbeCLIError | None) -> RankResult:
    data = error.body if isinstance(error, AgentHTTPError) else None
    rank = target.rank if target.rank is not None else Envelope.from_wire(data).rank
    return RankResult(rank, target.endpoint.label, False, data, error, target.host, target.pid)
