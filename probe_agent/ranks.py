"""Rank identity (RANK / LOCAL_RANK / WORLD_SIZE) and the registry of every rank's URL.

torch is never imported here: the registry only looks at ``sys.modules`` until the training
program has imported and initialised ``torch.distributed`` itself.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from probe_protocol.tokens import sign_entry

from .config import LOCAL_RANK_VARS, RANK_VARS, WORLD_SIZE_VARS, first_set

if TYPE_CHECKING:
    from .agent import Agent

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Identity:
    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    #: Ranks on this node (torchrun's LOCAL_WORLD_SIZE, srun's, Open MPI's); 1 when unknown.
    local_world_size: int = 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Identity:
        def num(name: str, default: int) -> int:
            try:
                return int(environ.get(name, default))
            except ValueError:
                return default

        local_rank = num(first_set(environ, LOCAL_RANK_VARS), 0)
        return cls(
            # No RANK but a LOCAL_RANK: Lightning's subprocess launcher sets only LOCAL_RANK
            # until init_process_group; on one node that is the rank (adopt_group corrects it).
            rank=num(first_set(environ, RANK_VARS), local_rank),
            local_rank=local_rank,
            world_size=num(first_set(environ, WORLD_SIZE_VARS), 1),
            host=socket.gethostname(),
            pid=os.getpid(),
            local_world_size=max(1, num(first_set(environ, (
                "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE")), 1)),
        )


def publish_rank(identity: Identity) -> None:
    """``PROBE_AGENT_RANK`` tells this process's children which rank is already served here:
    a child with another RANK / LOCAL_RANK is a rank of its own (_autostart.has_own_rank)."""
    os.environ["PROBE_AGENT_RANK"] = f"{identity.rank}:{identity.local_rank}"


def adopt_group(agent: Agent, rank: int, world_size: int) -> bool:
    """Give ``agent`` the identity ``init_process_group`` gave its process (issue 17); True when
    it changed. Lightning's rank 0 starts with no RANK or WORLD_SIZE, and a rank started from
    its environment may be renumbered by the group. Rows written from now on carry the new
    rank; the port stays (base + LOCAL_RANK, bound at start). Called on the training thread
    right after ``init_process_group`` returns (roles.py), and by the registry when it first
    sees the group (an agent injected after init)."""
    ident = agent.identity
    try:
        local = int(os.environ.get(first_set(os.environ, LOCAL_RANK_VARS), ""))
    except ValueError:
        local = ident.local_rank
    if (rank, world_size, local) == (ident.rank, ident.world_size, ident.local_rank):
        return False
    if rank != ident.rank:
        log.warning("probe agent: rank %d until now, init_process_group gave rank %d; using %d",
                    ident.rank, rank, rank)
    agent.identity = replace(ident, rank=rank, world_size=world_size, local_rank=local)
    agent.rank = rank
    agent.actions.rank = rank
    # The collectors stamp every row with the rank they were built with.
    for _, collector in agent.collectors.running():
        for holder in (collector, getattr(collector, "resolver", None)):
            if holder is not None and hasattr(holder, "rank"):
                holder.rank = rank
    publish_rank(agent.identity)
    return True


#: Keys live under this prefix in the job's c10d store: ``probe_agent/rank{N}`` -> JSON.
STORE_PREFIX = "probe_agent"
#: How often the registry looks for the process group, and retries while ranks are missing.
_TICK_S = 0.5


class RankRegistry:
    """Collector that publishes this rank's address in the job's c10d store and reads the others.

    The agent starts before ``init_process_group``, so the registry arms itself lazily: every
    0.5 s, on a thread of its own, it checks, without importing torch, whether
    ``torch.distributed`` is imported and initialised. Once it is, it clones the default store's
    TCPStore (a connection of its own, so a training thread blocked in a store call never holds
    ours), writes ``probe_agent/rank{N}`` = ``{rank, url, host, pid}``, and from then on reads
    the published entries with ``list_keys`` + ``multi_get`` — never a blocking ``get`` on a key
    that may not exist. Entries land in ``agent.peers``; ``/v1/ranks`` serves them.

    If the store cannot be reached, the failure is logged once and retried with back-off; the
    agent keeps serving itself, and ``/v1/ranks`` says why ranks are missing (``discovery``).
    NOTE: its own thread, not the store writer's tickers: a store call can block (2 s per call,
    and a TCPStore connect retries for the job's whole store timeout), and that must never hold
    up the rows of every table or the reads waiting for them.

    Args:
        agent: the running agent; its ``url``, ``identity`` and ``peers`` are read and written.
        refresh_s: once every rank has published, how often the list is re-read (ranks of an
            elastic job can come back at new addresses).
    """

    def __init__(self, agent: Agent, refresh_s: float = 30.0) -> None:
        self.agent = agent
        self.refresh_s = refresh_s
        self.store: Any = None
        self.world_size = 0
        self.published = False
        self.failures = 0
        self.last_error: str | None = None
        self._next = 0.0
        self._stop = threading.Event()

    def start(self, sink: Any) -> None:
        threading.Thread(target=self._loop, name="probe-agent.ranks", daemon=True).start()

    def stop(self) -> None:
        self._next = float("inf")  # the thread may be inside a store call: it ends after it
        self._stop.set()
        self.store = None

    def _loop(self) -> None:
        while not self._stop.wait(_TICK_S):
            self.tick()

    def describe(self) -> dict[str, Any]:
        """How discovery stands, for ``/v1/ranks``: the CLI says why ranks are missing."""
        if self.store is None and self.failures == 0:
            state = "waiting"  # torch.distributed not initialised yet (or never: one process)
        elif self.last_error is not None:
            state = "failing"
        else:
            state = "ok"
        return {"state": state, "failures": self.failures, "error": self.last_error}

    def entry(self) -> dict[str, Any]:
        ident = self.agent.identity
        url = self.agent.url
        if url:
            # A wildcard bind is reachable at the host's name, not at 0.0.0.0.
            for wildcard in ("//0.0.0.0:", "//[::]:"):
                url = url.replace(wildcard, f"//{ident.host}:")
        entry = {"rank": self.agent.rank, "url": url, "host": ident.host, "pid": ident.pid}
        token = self.agent.config.token
        # The store has no authentication: the CLI dials an entry only if the job's token
        # signed it (probe_protocol/tokens.py).
        return sign_entry(token, entry) if token else entry

    def tick(self) -> None:
        """Called every _TICK_S on the registry's thread; cheap until the default process
        group exists."""
        now = time.monotonic()
        if now < self._next:
            return
        try:
            if self.store is None:
                dist = sys.modules.get("torch.distributed")
                if dist is None or not getattr(dist, "is_initialized", lambda: False)():
                    return
                self._arm(dist)
            if not self.published:
                self.store.set(f"rank{self.agent.rank}", json.dumps(self.entry()))
                self.published = True
            self._read()
            self.failures, self.last_error = 0, None  # the store answers (again)
            complete = len(self.agent.peers) >= self.world_size
            self._next = now + (self.refresh_s if complete else _TICK_S)
        except Exception as e:  # store down or gone: serve ourselves, retry later
            self.failures += 1
            first_line = (str(e).strip().splitlines() or [""])[0][:300]
            self.last_error = f"{type(e).__name__}: {first_line}"
            if self.failures == 1:
                log.warning(
                    "probe agent on rank %d: cannot use the job's c10d store for rank "
                    "discovery (%s); this agent serves itself only, pass -t for the others",
                    self.agent.rank, self.last_error,
                )
            self._next = now + min(30.0, 0.5 * 2 ** min(self.failures, 6))

    def _arm(self, dist: Any) -> None:
        from datetime import timedelta

        store = dist.distributed_c10d._get_default_store()
        base = getattr(store, "_underlying_non_prefix_store", None) or store
        host, port = getattr(base, "host", None), getattr(base, "port", None)
        if isinstance(host, str) and isinstance(port, int):
            # TCPStore.clone() retries a refused connect for the job's store timeout (30 min
            # by default): find out in 2 s whether anything listens there at all.
            try:
                socket.create_connection((host, port), timeout=2.0).close()
            except OSError as e:
                raise ConnectionError(
                    f"cannot connect to the c10d store at {host}:{port} ({e.strerror or e})"
                ) from e
        try:
            base = base.clone()  # our own connection to the TCPStore
        except (AttributeError, RuntimeError):
            pass  # HashStore/FileStore: no clone; we only ever make non-blocking calls
        base.set_timeout(timedelta(seconds=2))
        # Normally done already by roles' init_process_group wrapper; an agent injected after
        # init (or a group made another way) learns its identity here.
        self.agent.adopt_group(dist.get_rank(), dist.get_world_size())
        self.world_size = dist.get_world_size()
        self.store = dist.PrefixStore(STORE_PREFIX, base)

    def _read(self) -> None:
        keys = sorted(k for k in self.store.list_keys() if k.startswith("rank"))
        if not keys:
            return
        peers: dict[int, dict[str, Any]] = {}
        for key, raw in zip(keys, self.store.multi_get(keys)):
            try:
                value = json.loads(bytes(raw).decode())
                peers[int(value["rank"])] = value
            except (ValueError, KeyError, TypeError):
                log.debug("probe agent: ignoring malformed store entry %s", key)
        self.agent.peers = peers


def build_registry(agent: Agent) -> RankRegistry:
    return RankRegistry(agent)
