"""Simulated ranks: many cheap fake ranks per process, so a thousand fit on a 2-core machine.

Used by tests/integration/test_node_fanout.py and bench/bench_fanout.py. What is real and what
is simulated:

- real: the HTTP parsing and answers of the watchdog (``probe_agent/watchdog/httpwire.py``),
  the access rule (``probe_agent.access.Policy``: owner by the kernel's peer uid, token, token
  proof), the wire bodies (``probe_protocol``), the signed rank list, and the node route, served
  by the watchdog's own relay (``probe_agent/watchdog/nodefan.py``) over real unix sockets;
- simulated: the training process and its agent. A rank is two listeners on one event loop
  (TCP ``127.0.0.1:BASE+rank`` and ``<dir>/node<h>/<pid>.sock``; ``pid`` is a made-up number,
  ``host`` is ``sim-node<h>``). ``/v1/backtrace`` answers a canned stack (a main thread in
  ``all_reduce``; rank ``--odd-rank`` sits in the DataLoader instead) with per-rank thread ids;
  ``/v1/query`` runs the statement in DuckDB over one rank's worth of ``python.backtrace`` rows
  (every rank the same rows, labelled with its rank) and streams the answer chunked, as the
  agent does; ``/v1/collectives`` says all_reduce #42
  has waited 30 s on every rank but the odd one.

Usage (one process hosts nodes ``--first`` .. ``--last``; it prints ``ready`` once listening)::

    python tests/simranks.py --dir D --world 64 --per-node 8 --first 0 --last 7 --base 21000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from probe_agent.access import Policy, header_map  # noqa: E402
from probe_agent.watchdog.httpwire import BadRequest, json_response, read_request  # noqa: E402
from probe_agent.watchdog.nodefan import NodeRelay  # noqa: E402
from probe_protocol.bodies import BacktraceBody, CollectivesBody, HealthBody  # noqa: E402
from probe_protocol.envelope import error_body  # noqa: E402
from probe_protocol.peers import Peer, tcp_peer, unix_peer_uid  # noqa: E402
from probe_protocol.query import QueryBody, QueryRequest  # noqa: E402
from probe_protocol.routes import (  # noqa: E402
    BACKTRACE,
    COLLECTIVES,
    HEALTH,
    NODE_FANOUT,
    QUERY,
    RANKS,
)
from probe_protocol.tokens import sign_entry  # noqa: E402

PID_BASE = 3_000_000
TRAIN = [("train", "train.py", 88), ("train_step", "train.py", 61),
         ("backward", "torch/_tensor.py", 581),
         ("_engine_run_backward", "torch/autograd/graph.py", 825)]
WAIT = [("all_reduce", "torch/distributed/distributed_c10d.py", 2806),
        ("wrapper", "torch/distributed/c10d_logger.py", 81)]
LOADER = [("__next__", "torch/utils/data/dataloader.py", 733),
          ("_next_data", "torch/utils/data/dataloader.py", 789),
          ("fetch", "torch/utils/data/_utils/fetch.py", 52)]


def frames(funcs: list[tuple[str, str, int]]) -> list[dict[str, Any]]:
    """Innermost first, as the agent sends them."""
    return [{"depth": d, "func": f, "file": f"/venv/lib/python3.11/site-packages/{p}",
             "lineno": n, "frame_type": "Python", "locals": None}
            for d, (f, p, n) in enumerate(reversed(funcs))]


def entries(world: int, per_node: int, base: int, token: str | None) -> list[dict[str, Any]]:
    """The job's rank list, as the agents would publish it (signed when there is a token)."""
    out = []
    for r in range(world):
        e = {"rank": r, "url": f"http://127.0.0.1:{base + r}", "host": f"sim-node{r // per_node}",
             "pid": PID_BASE + r}
        out.append(sign_entry(token, e) if token else e)
    return out


class SimNode:
    """The ranks of one simulated node, all served from this process's event loop."""

    def __init__(self, args: argparse.Namespace, node: int, token: str | None, db: Any) -> None:
        self.args, self.node, self.db = args, node, db
        self.host = f"sim-node{node}"
        self.run_dir = os.path.join(args.dir, f"node{node}")
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        self.policy = Policy(owner_uid=os.getuid(), token=token,
                             host_names=frozenset({"localhost"}))
        self.entries = entries(args.world, args.per_node, args.base, token)
        self.stall = node in args.stall
        lo = node * args.per_node
        self.ranks = range(lo, min(lo + args.per_node, args.world))
        self.relays = {r: NodeRelay(self.run_dir, token, self.host, r) for r in self.ranks}

    async def start(self) -> list[asyncio.AbstractServer]:
        servers = []
        for r in self.ranks:
            tcp = await asyncio.start_server(
                lambda rd, wr, r=r: self.handle(rd, wr, r, "tcp"), "127.0.0.1",
                self.args.base + r, backlog=512)
            uds = await asyncio.start_unix_server(
                lambda rd, wr, r=r: self.handle(rd, wr, r, "unix"),
                os.path.join(self.run_dir, f"{PID_BASE + r}.sock"), backlog=512)
            servers += [tcp, uds]
        return servers

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     rank: int, kind: str) -> None:
        sock = writer.get_extra_info("socket")
        if kind == "tcp":
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = tcp_peer(sock)
        else:
            peer = Peer("unix", unix_peer_uid(sock), "unix")
        try:
            while True:
                try:
                    req = await read_request(reader, writer)
                except BadRequest as e:
                    writer.write(json_response(e.status, error_body(rank, e.status, e.message),
                                               close=True))
                    return
                if req is None:
                    return
                writer.write(await self.answer(req, rank, peer, writer))
                await writer.drain()
                if not req.keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def answer(self, req: Any, rank: int, peer: Peer, writer: Any) -> bytes:
        refusal = self.policy.check(peer, req.method, req.path, header_map(req.headers))
        if refusal is not None:
            return json_response(refusal.status, error_body(rank, refusal.status,
                                                            refusal.message),
                                 headers=refusal.headers)
        pid = PID_BASE + rank
        if HEALTH.matches(req.method, req.path):
            sockname = writer.get_extra_info("sockname")
            reached = (sockname[0], sockname[1]) if isinstance(sockname, tuple) else None
            proof = self.policy.health_extra(req.query, reached).get("proof")
            return json_response(200, HealthBody(rank, proof=proof).to_wire())
        if RANKS.matches(req.method, req.path):
            return json_response(200, {"ok": True, "rank": rank, "ranks": self.entries,
                                       "world_size": self.args.world,
                                       "discovery": {"state": "ok"}})
        if BACKTRACE.matches(req.method, req.path):
            return json_response(200, BacktraceBody(
                rank, pid=pid, host=self.host, source="in-process", route="in-process",
                threads=self.threads(rank), elapsed_ms=0.1).to_wire())
        if QUERY.matches(req.method, req.path):
            return self.query(req, rank)
        if COLLECTIVES.matches(req.method, req.path):
            return json_response(200, CollectivesBody(
                rank, recording=True, collectives=self.collectives(rank),
                now=time.time()).to_wire())
        if NODE_FANOUT.matches(req.method, req.path):
            if self.stall:  # a node agent that accepted the request and never answers
                await asyncio.sleep(3600)
            status, body = await self.relays[rank].answer(
                req.body, req.header("authorization"), self.entries)
            return json_response(status, body)
        return json_response(404, error_body(rank, 404, f"{req.path}: not simulated"))

    def threads(self, rank: int) -> tuple[dict[str, Any], ...]:
        stack = TRAIN + (LOADER if rank == self.args.odd_rank else WAIT)
        return ({"thread_id": 139_000_000 + rank * 4096, "thread_name": "MainThread",
                 "is_main": True, "is_agent": False, "frames": frames(stack)},
                {"thread_id": 139_500_000 + rank * 4096, "thread_name": "pt_autograd_0",
                 "is_main": False, "is_agent": False,
                 "frames": frames([("_bootstrap", "threading.py", 1002)])})

    def collectives(self, rank: int) -> tuple[dict[str, Any], ...]:
        """all_reduce #41 done everywhere; #42 entered 30 s ago by all but the odd rank."""
        def row(seq: int, state: str, ago: float) -> dict[str, Any]:
            return {"rank": rank, "pg": "0", "pg_desc": "default_pg", "seq": seq,
                    "op": "all_reduce", "state": state, "start_time": time.time() - ago,
                    "is_p2p": False, "group_ranks": list(range(self.args.world)),
                    "callsite": "train.py:61 train_step"}
        done = row(41, "done", 30.5)
        if rank == self.args.odd_rank:
            return (done,)
        return (done, row(42, "pending", 30.0))

    def query(self, req: Any, rank: int) -> bytes:
        q = QueryRequest.from_wire(json.loads(req.body or b"{}"))
        t0 = time.perf_counter()
        db = self.db  # one connection: the event loop runs one query at a time
        try:
            db.execute(f"SET VARIABLE sim_rank = {rank}")
            db.execute(q.sql)
            cap = q.max_rows or 1000
            rows = db.fetchmany(cap + 1)
            cols = tuple(d[0] for d in db.description or ())
            types = tuple(str(d[1]) for d in db.description or ())
        except Exception as e:  # noqa: BLE001 - the simulated agent's 400, as the real one's
            return json_response(400, error_body(rank, 400, str(e).splitlines()[0]))
        body = QueryBody(rank, cols, types, (), len(rows) > cap,
                         round((time.perf_counter() - t0) * 1e3, 3))
        # Streamed as the agent streams it: chunked, no length (serving/routes' query).
        parts = body.stream(",".join(json.dumps(list(r)) for r in rows[:cap]).encode()
                            for _ in (0,))
        head = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"transfer-encoding: chunked\r\n\r\n")
        return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"


def make_db() -> Any:
    """One rank's stack as ``python.backtrace`` rows; ``rank`` is the asking rank's."""
    import duckdb

    db = duckdb.connect(":memory:")
    db.execute("SET threads = 1")
    db.execute("CREATE SCHEMA python")
    db.execute("CREATE TABLE python.frames (thread_id BIGINT, thread_name VARCHAR, "
               "depth INTEGER, func VARCHAR, file VARCHAR, lineno INTEGER)")
    for f in frames(TRAIN + WAIT):
        db.execute("INSERT INTO python.frames VALUES (1, 'MainThread', ?, ?, ?, ?)",
                   [f["depth"], f["func"], f["file"], f["lineno"]])
    db.execute("CREATE VIEW python.backtrace AS SELECT getvariable('sim_rank') AS rank, * "
               "FROM python.frames")
    return db


async def serve(args: argparse.Namespace) -> None:
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    db = make_db()
    servers = []
    for node in range(args.first, args.last + 1):
        servers += await SimNode(args, node, token, db).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


def free_base(n: int, start: int = 21000) -> int:
    """A base port with ``n`` consecutive free ports after it."""
    base = start
    while base + n < 65000:
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    base = p + 1
                    break
        else:
            return base
    raise RuntimeError(f"no {n} consecutive free ports")


def start(root: str, world: int, per_node: int, procs: int, *, token_file: str | None = None,
          stall: tuple[int, ...] = ()) -> tuple[int, list[subprocess.Popen[str]]]:
    """``world`` simulated ranks, ``per_node`` a node, the nodes spread over ``procs``
    processes; ``(base port, processes)`` once every one is listening. Stop with ``stop``."""
    nodes = -(-world // per_node)
    base = free_base(world)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    out: list[subprocess.Popen[str]] = []
    try:
        for i in range(procs):
            first, last = i * nodes // procs, (i + 1) * nodes // procs - 1
            if last < first:
                continue
            cmd = [sys.executable, __file__, "--dir", root, "--world", str(world),
                   "--per-node", str(per_node), "--first", str(first), "--last", str(last),
                   "--base", str(base), "--stall", ",".join(map(str, stall))]
            if token_file:
                cmd += ["--token-file", token_file]
            out.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True,
                                        start_new_session=True))
        for p in out:
            line = p.stdout.readline() if p.stdout else ""
            if line.strip() != "ready":
                raise RuntimeError(f"simulated ranks exited: rc={p.poll()}")
    except BaseException:
        stop(out)
        raise
    return base, out


def stop(procs: list[subprocess.Popen[str]]) -> None:
    """Kill each simulator's process group (each is a session leader) and reap it."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait(10)
        if p.stdout:
            p.stdout.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="root of the simulated nodes' run dirs")
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--per-node", type=int, default=8)
    ap.add_argument("--first", type=int, default=0, help="first node this process hosts")
    ap.add_argument("--last", type=int, default=0, help="last node this process hosts")
    ap.add_argument("--base", type=int, required=True, help="rank r listens on BASE + r")
    ap.add_argument("--token-file", default=None)
    ap.add_argument("--odd-rank", type=int, default=3, help="the rank stuck elsewhere")
    ap.add_argument("--stall", type=lambda s: {int(x) for x in s.split(",") if x},
                    default=set(), help="nodes whose node route never answers")
    asyncio.run(serve(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
