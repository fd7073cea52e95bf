"""The watchdog's HTTP front: forward to the agent with a deadline, or answer for it.

Per request, on the connection's own asyncio task (nothing is shared but two small semaphores,
so a stuck request never delays the next one):

- the rank is dead: answer from the forensics (``/v1/backtrace`` 200 with ``state: "dead"``,
  every other route 410 with the cause);
- ``GET /v1/backtrace``: forward; if the agent has not answered within the deadline, or its
  heartbeat is already older than the deadline, read the stacks from outside instead;
- anything else: forward and relay; while waiting, a heartbeat older than the deadline means the
  rank's Python is not running, and the client gets a 504 that says so at once; a fresh
  heartbeat with an event loop that does not answer a health check (liveness.py) gets a 504
  within 1.5 deadlines too.

This module decides when to wait for the agent and when to stop; what is said in the agent's
place is standin.py's, and the agent's private socket is upstream.py's.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from typing import Any

from probe_protocol.bodies import HealthBody
from probe_protocol.peers import Peer, tcp_peer, unix_peer_uid
from probe_protocol.routes import BACKTRACE, EVAL, HEALTH, NODE_FANOUT, RANKS

from ..access import (
    LINGER_S,
    REQUEST_TIMEOUT_S,
    ConnectionLimits,
    Policy,
    header_map,
    overload_message,
    reserve_refusal,
)
from .children import ChildReaders, read_children
from .compiling import compiling_note
from .health import HealthWatch, http_status
from .httpwire import BadRequest, Request, error_response, json_response, read_request
from .liveness import LoopCheck
from .nodefan import NodeRelay
from .rank import RankWatch
from .reader import ReadError, StackReader, stop_note
from .refusal_report import RefusalReporter
from .standin import StandIn
from .upstream import CHUNK, RELAY_IDLE_S, Upstream

#: How long the owner's keep-alive connection may sit idle between requests; anyone else's gets
#: REQUEST_TIMEOUT_S (access.py), so idle sockets cannot pile up against the connection limits.
IDLE_S = 60.0
#: Longest a forwarded request may wait for the agent while the agent is alive and its heartbeat
#: fresh (the agent's own timeouts, PROBE_QUERY_TIMEOUT_MS and PROBE_EVAL_TIMEOUT_S, end
#: requests well before this).
MAX_WAIT_S = 600.0
#: A /v1/ranks answer up to this size is read whole to refresh the watchdog's copy;
#: 512 ranks take about 50 KB.
RANKS_MAX_BYTES = 4 * 1024 * 1024


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < 1e7 else None


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close and drop what the client already sent, for up to LINGER_S, before the close:
    a close with unread input is a TCP reset, which can destroy the answer just written."""
    loop = asyncio.get_running_loop()
    try:
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        deadline = loop.time() + LINGER_S
        while (left := deadline - loop.time()) > 0:
            if not await asyncio.wait_for(reader.read(CHUNK), left):
                break
    except (asyncio.TimeoutError, ConnectionError, OSError):
        pass


#: How long a 504 waits for the stack read that says whether the rank is compiling.
COMPILING_READ_S = 0.5


class Proxy:
    def __init__(self, cfg: dict[str, Any], rank: RankWatch, reader: StackReader) -> None:
        self.cfg = cfg
        self.rank_no = cfg["rank"]
        self.pid = cfg["pid"]
        self.host = cfg.get("hostname")
        self.inner = cfg["inner_path"]
        self.policy = Policy(owner_uid=os.getuid(), token=cfg.get("token"),
                             host_names=frozenset(cfg.get("host_names") or ()))
        self.limits = ConnectionLimits(self.policy)
        self.port = cfg.get("port")
        self.deadline_s = cfg["deadline_ms"] / 1000.0
        self.rank = rank
        self.upstream = Upstream(self.inner, self.deadline_s)
        #: Refused requests, reported to the agent exactly once (refusal_report.py).
        self.refusals = RefusalReporter(lambda req: self.upstream.ask(req, "watchdog"),
                                      lambda: rank.alive, self.deadline_s)
        #: What is answered while the agent cannot answer, the last /v1/ranks included.
        self.stand_in = StandIn(self.rank_no, self.pid, self.host, rank, reader)
        #: healthy / starting / hung / dead for schedulers (health.py); started by main.py
        self.health = HealthWatch(rank)
        #: one stack reader per child process (children.py), for ?children=1
        self.child_readers = ChildReaders()
        self.node = NodeRelay(os.path.dirname(self.inner), cfg.get("token"), self.host,
                              self.rank_no)

    # -- connections ------------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     kind: str) -> None:
        sock = writer.get_extra_info("socket")
        keys: list[str] | None = None
        try:
            if kind == "tcp":
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                peer = tcp_peer(sock)
            else:
                peer = Peer("unix", unix_peer_uid(sock), "unix")
                if not self.policy.is_owner(peer):
                    refusal = self.policy.check(peer, "", "", {})
                    assert refusal is not None
                    self.refusals.add(peer, "CONNECT unix", refusal)
                    writer.write(self._error(403, refusal.message, close=True))
                    await _linger(reader, writer)
                    return
            # Per-class limits (access.py): another uid's or host's flood cannot take the
            # owner's connections. Checked before reading anything.
            keys = self.limits.admit(peer)
            if keys is None:
                writer.write(self._error(503, overload_message(peer), close=True))
                await _linger(reader, writer)
                return
            idle = IDLE_S if self.policy.is_owner(peer) else REQUEST_TIMEOUT_S
            first = True
            while True:
                try:
                    # The first request must arrive whole within REQUEST_TIMEOUT_S (a half-open
                    # socket is dropped then, not after a minute).
                    req = await asyncio.wait_for(read_request(reader, writer),
                                                 REQUEST_TIMEOUT_S if first else idle)
                except BadRequest as e:
                    writer.write(self._error(e.status, e.message, close=True))
                    return
                first = False
                if req is None:
                    return
                busy = reserve_refusal(keys, req.method, req.path)
                if busy is not None:
                    writer.write(self._error(503, busy, close=True))
                    return
                keep = await self.dispatch(req, writer, peer) and req.keep_alive
                await writer.drain()
                if not keep:
                    return
        except (asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self.limits.release(keys)
            try:
                await writer.drain()
            except (ConnectionError, RuntimeError):
                pass
            writer.close()

    def _error(self, status: int, message: str, *, close: bool = False,
               headers: tuple[tuple[str, str], ...] = (), **extra: Any) -> bytes:
        return error_response(self.rank_no, status, message, close=close, headers=headers,
                              **extra)

    async def dispatch(self, req: Request, writer: asyncio.StreamWriter, peer: Peer) -> bool:
        """Answer one request; False when the connection must close afterwards."""
        refusal = self.policy.check(peer, req.method, req.path, header_map(req.headers))
        if refusal is not None:
            self.refusals.add(peer, f"{req.method} {req.path}", refusal)
            writer.write(self._error(refusal.status, refusal.message, close=True,
                                     headers=refusal.headers))
            return False
        client = peer.label()
        if HEALTH.matches(req.method, req.path) and "status" in req.query:
            # A scheduler's liveness probe: answered here, within milliseconds, whatever the
            # rank's Python is doing, and after it died (health.py).
            st = self.health.state(_number((req.query.get("stall") or [""])[-1]))
            code = http_status(st["state"])
            writer.write(json_response(code, HealthBody(
                self.rank_no, status="ok" if code == 200 else "unhealthy", host=self.host,
                pid=self.pid, **st).to_wire()))
            return True
        if HEALTH.matches(req.method, req.path) and req.query.get("challenge"):
            # The proof is the watchdog's to give: it holds the token and the port, and must
            # give it while the agent's Python is frozen too.
            sockname = writer.get_extra_info("sockname")
            reached = (sockname[0], self.port) if isinstance(sockname, tuple) and self.port \
                else None
            proof = self.policy.health_extra(req.query, reached)
            health = HealthBody(self.rank_no, proof=proof.get("proof"))
            writer.write(json_response(200, health.to_wire()))
            return True
        if NODE_FANOUT.matches(req.method, req.path):
            # Served here, not by the agent: the node's other ranks answer even while this
            # rank's Python is stuck or dead.
            if self.stand_in.ranks_raw is None and self.rank.alive:
                self.stand_in.remember(await self.upstream.fetch(RANKS.path))
            status, body = await self.node.answer(req.body, req.header("authorization"),
                                                  self.stand_in.ranks_raw or [])
            writer.write(json_response(status, body))
            return True
        is_backtrace = BACKTRACE.matches(req.method, req.path)
        if not self.rank.alive:
            if RANKS.matches(req.method, req.path) and self.stand_in.ranks_cache:
                writer.write(json_response(200, self.stand_in.known_ranks()))
            else:
                writer.write(self.stand_in.dead(req, is_backtrace))
            return True
        if is_backtrace:
            return await self.backtrace(req, writer, client)
        return await self.forward(req, writer, client)

    # -- forwarding -------------------------------------------------------------------------
    def _stale(self) -> float | None:
        """Seconds since the agent's Python last ran, when that is past the deadline and the
        agent did not say it would be busy until now (a heap walk: beat.py)."""
        hb = self.rank.heartbeat()
        if hb is not None and hb[0] > self.deadline_s and not hb[2]:
            return hb[0]
        return None

    def _busy(self) -> bool:
        """The agent holds the GIL on purpose for a while yet (its heartbeat says so)."""
        hb = self.rank.heartbeat()
        return hb is not None and hb[2] > 0

    async def forward(self, req: Request, writer: asyncio.StreamWriter, client: str) -> bool:
        task = asyncio.ensure_future(self.upstream.ask(req, client))
        started = time.monotonic()
        # Already stale on arrival: the agent's Python has not run for a whole deadline, so do
        # not make the client wait another one.
        patience = 0.0 if self._stale() is not None else self.deadline_s
        # Discovery is the first step of every fan-out, `probe backtrace` included: it gets the
        # backtrace's deadline, not MAX_WAIT_S, even while the heartbeat is fresh (a wedged
        # event loop beside a live training thread).
        is_ranks = RANKS.matches(req.method, req.path)
        loop_check = LoopCheck(self.upstream.fetch, self.deadline_s)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.05 if patience else 0.01)
                if done:
                    break
                waited = time.monotonic() - started
                if not is_ranks and not self._busy() and loop_check.wedged(waited) and \
                        self.rank.alive:
                    task.cancel()
                    compiling = await self._compiling()
                    why = ("(a route is blocking it)" if compiling is None else
                           f"(it is compiling: {compiling}; a recompile keeps the agent's "
                           "threads from the GIL, and the job goes on when it ends)")
                    writer.write(self._error(
                        504, f"rank {self.rank_no}'s agent did not answer: its event loop has "
                        f"not served a request for {waited:.1f} s while its Python runs "
                        f"{why}; `probe backtrace` still answers "
                        f"(out-of-process){eval_note(req)}", loop_wedged=True,
                        eval_id=eval_id(req), compiling=compiling))
                    return True
                if await self._gave_up(req, writer, task, started, patience, is_ranks):
                    return True
        finally:
            loop_check.close()
        return await self._relayed(req, writer, task, is_ranks)

    async def _gave_up(self, req: Request, writer: asyncio.StreamWriter, task: Any,
                       started: float, patience: float, is_ranks: bool) -> bool:
        """Whether to stop waiting for the agent; if so, the client has been answered."""
        waited = time.monotonic() - started
        stale = self._stale()
        if not (not self.rank.alive or (stale is not None and waited >= patience) or
                (is_ranks and waited >= self.deadline_s) or waited > MAX_WAIT_S):
            return False
        task.cancel()
        if not self.rank.alive:
            writer.write(self.stand_in.dead(req, False))
            return True
        if is_ranks:
            # Discovery must still fan out to the other ranks while this one is stuck.
            writer.write(json_response(200, self.stand_in.known_ranks()))
            return True
        stopped = stop_note(self.pid)
        compiling = None if stopped else await self._compiling()
        what = (f"is not running: {stopped}" if stopped else
                f"is compiling: {compiling}; the compiler has kept the agent's threads from "
                f"the GIL for {stale:.1f} s (a recompile: the job goes on when it ends)"
                if compiling is not None and stale is not None else
                f"is compiling: {compiling}, and the agent did not answer within "
                f"{MAX_WAIT_S:g} s" if compiling is not None else
                f"has not run for {stale:.1f} s (its GIL is held, probably by a C call)"
                if stale is not None else f"did not answer within {MAX_WAIT_S:g} s")
        writer.write(self._error(
            504, f"rank {self.rank_no}'s Python {what}; `probe backtrace` still answers "
            f"(out-of-process){eval_note(req)}", gil_held=stale is not None,
            heartbeat_age_s=round(stale, 3) if stale is not None else None,
            eval_id=eval_id(req), compiling=compiling))
        return True

    async def _compiling(self) -> str | None:
        """Where the rank compiles (torch.compile), read from its stacks outside the process;
        None when it does not, or they cannot be read within a deadline."""
        try:
            # bounded: the 504 it decorates must not wait on it (a short GIL hold would be
            # over, and answered 200, before a slow read came back)
            read = await asyncio.wait_for(self.stand_in.reader.read(), COMPILING_READ_S)
        except (ReadError, asyncio.TimeoutError, OSError):
            return None
        return compiling_note(read)

    async def _relayed(self, req: Request, writer: asyncio.StreamWriter, task: Any,
                       is_ranks: bool) -> bool:
        """Relay the agent's answer to ``req`` (``task`` has finished)."""
        try:
            head, r, w = task.result()
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as e:
            if not self.rank.alive:
                writer.write(self.stand_in.dead(req, False))
                return True
            writer.write(self._error(502, f"rank {self.rank_no}'s agent did not answer "
                                     f"({type(e).__name__}: {e}); is it stopping?"))
            return True
        if is_ranks and head.status == 200 and head.length is not None and \
                head.length <= RANKS_MAX_BYTES:
            # Every discovery refreshes the copy served while the agent cannot answer, not
            # only the periodic snapshot: the newest ranks a client saw are the ones kept.
            try:
                data = await asyncio.wait_for(r.readexactly(head.length), RELAY_IDLE_S)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                return False  # the agent went away mid-body: the client sees the close
            finally:
                w.close()
            self.stand_in.remember_ranks(data)
            writer.write(head.relay_head(False) + data)
            return True
        return await self.upstream.relay(writer, head, r, w)

    async def backtrace(self, req: Request, writer: asyncio.StreamWriter, client: str) -> bool:
        started = time.monotonic()
        # ?children=1: the rank's children (DataLoader workers) are read from outside, here,
        # beside the rank's own stack, so they come whatever the rank's GIL does (children.py)
        kids = asyncio.ensure_future(read_children(
            self.pid, self.stand_in.reader, self.child_readers, want_locals=req.flag("locals"),
            secrets=req.flag("secrets"), all_threads=req.flag("all"))) \
            if req.flag("children") else None
        stale = self._stale()
        stopped = stop_note(self.pid)
        if stopped is not None:  # its agent cannot answer: no need to wait a deadline for it
            reason = stopped
        elif stale is not None:
            reason = (f"the agent's Python has not run for {stale:.1f} s (heartbeat): its GIL "
                      "is held, probably by a C call")
        else:
            task = asyncio.ensure_future(self.upstream.ask(req, client))
            done, _ = await asyncio.wait({task}, timeout=self.deadline_s)
            if done and task.exception() is None:
                head, r, w = task.result()
                if kids is None or head.status != 200:
                    if kids is not None:
                        kids.cancel()
                    return await self.upstream.relay(writer, head, r, w)
                body = await self.upstream.read_json(head, r, w)
                if body is not None:
                    writer.write(json_response(200, {**body, "children": await kids}))
                    return True
                reason = "the agent's answer could not be read whole to add the children"
            if done:
                e = task.exception()
                reason = f"the agent did not answer ({type(e).__name__}: {e})"
            else:
                task.cancel()
                reason = (f"the agent did not answer within {self.deadline_s * 1000:.0f} ms "
                          "(PROBE_BACKTRACE_DEADLINE_MS)")
        writer.write(await self.stand_in.out_of_process(req, reason, started, kids))
        return True

    async def fetch_in_process(self) -> dict[str, Any] | None:
        """The in-process backtrace (for snapshots), or None if the agent does not answer.
        Refreshes the /v1/ranks cache on the way."""
        ranks = await self.upstream.fetch(RANKS.path)
        self.stand_in.remember(ranks)
        return await self.upstream.fetch(BACKTRACE.path + "?all=1")


def eval_id(req: Request) -> str | None:
    """The id of the eval ``req`` carries (``POST /v1/eval``'s ``id``), or None."""
    if not EVAL.matches(req.method, req.path):
        return None
    try:
        body = json.loads(req.body or b"null")
    except ValueError:
        return None
    found = body.get("id") if isinstance(body, dict) else None
    return found if isinstance(found, str) and found.isprintable() and len(found) <= 64 \
        else None


def eval_note(req: Request) -> str:
    """What becomes of an eval the watchdog stopped waiting for: it was handed to the agent,
    whose Python runs it once it runs again. Said, with how to stop it, so that nobody sends
    it a second time under a new id."""
    if not EVAL.matches(req.method, req.path):
        return ""
    found = eval_id(req)
    if found is None:
        return ("; the eval was handed to the agent and will still run once its Python runs "
                "again (`GET /v1/evals` lists it; `probe eval --cancel ID` stops it)")
    return (f"; the eval was handed to the agent and will still run once its Python runs again, "
            f"as eval {found}: `probe eval --cancel {found}` stops it, and the same request "
            "sent again (same id) answers with its result instead of running it twice")
