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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from probe_protocol.bodies import RankEntry
from probe_protocol.tokens import sign_entry

from .settings import LOCAL_RANK_VARS, RANK_VARS, WORLD_SIZE_VARS, first_set

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


#: Keys live under this prefix in the job's c10d store: ``probe_agent/rank{N}`` -> JSON.
STORE_PREFIX = "probe_agent"
#: Bumped by every publish (``add``); a reader re-reads the entries only when it moved.
GENERATION_KEY = "generation"
#: Largest entry kept: ours are ~300 bytes. The c10d store has no size query, so a value is read
#: whole; a bigger one was written by someone else and is deleted after that one read.
MAX_ENTRY_BYTES = 16 * 1024
#: How often the registry looks for the process group, and retries while ranks are missing.
_TICK_S = 0.5


class RankRegistry:
    """Collector that publishes this rank's address in the job's c10d store and reads the others.

    The agent starts before ``init_process_group``, so the registry arms itself lazily: every
    0.5 s, on a thread of its own, it checks, without importing torch, whether
    ``torch.distributed`` is imported and initialised. Once it is, it clones the default store's
    TCPStore (a connection of its own, so a training thread blocked in a store call never holds
    ours), writes ``probe_agent/rank{N}`` = ``{rank, url, host, pid}`` and bumps
    ``probe_agent/generation``. Entries go to ``on_peers`` (the agent's ``peers``, which
    ``/v1/ranks`` serves).

    Anyone who reaches the store can write it (docs/decisions/security.md, "The job's c10d
    store"), so the reads are bounded whatever is in it:

    - only the keys ``rank0`` .. ``rank{world_size-1}`` are read, each with ``check`` then
      ``get`` (both release the GIL while they wait on the network), never ``list_keys``: with
      200,000 keys under the prefix that one call held the GIL for 21 s, and ``multi_get`` of
      large values holds it in long slices too;
    - a value over MAX_ENTRY_BYTES, or one that is not the entry of the rank its key names, is
      dropped (an oversized one is deleted, so it is read once);
    - the entries are re-read only when the generation moved, and otherwise only this rank's
      own, every ``refresh_s``: if someone rewrote or deleted it, it is published again, so a
      forged entry for a live rank lasts one refresh at most.

    If the store cannot be reached, the failure is logged once and retried with back-off; the
    agent keeps serving itself, and ``/v1/ranks`` says why ranks are missing (``discovery``).
    NOTE: its own thread, not the store writer's tickers: a store call can block (2 s per call,
    and a TCPStore connect retries for the job's whole store timeout), and that must never hold
    up the rows of every table or the reads waiting for them.

    Args:
        me: this rank's entry as it stands now (``{rank, url, host, pid}``; the URL may have a
            wildcard host, replaced here by the host name).
        on_group: called with (rank, world size) when the registry first sees the process
            group: an agent injected after ``init_process_group`` learns its identity there.
        on_peers: receives every rank's entry, by rank, after each read.
        token: the job's token (PROBE_TOKEN); this rank's entry is signed with it, since the
            store itself has no authentication.
        refresh_s: once every rank has published, how often this rank checks its own entry and
            the generation (ranks of an elastic job can come back at new addresses).
    """

    def __init__(self, me: Callable[[], RankEntry],
                 on_group: Callable[[int, int], None],
                 on_peers: Callable[[dict[int, RankEntry]], None],
                 token: str | None = None, refresh_s: float = 30.0) -> None:
        self.me = me
        self.token = token
        self.on_group = on_group
        self.on_peers = on_peers
        self.peers = 0  # how many ranks the last read found
        self.refresh_s = refresh_s
        self.store: Any = None
        self.world_size = 0
        self.published = False
        self.failures = 0
        self.last_error: str | None = None
        #: Entries dropped because someone else wrote them (oversized, wrong rank, malformed),
        #: and times our own entry had to be published again.
        self.dropped = 0
        self.republished = 0
        self._mine: bytes | None = None  # what we published, as published
        self._generation: int | None = None  # the generation of the last full read
        self._entries: dict[int, RankEntry] = {}
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
        return {"state": state, "failures": self.failures, "error": self.last_error,
                "dropped": self.dropped, "republished": self.republished}

    def entry(self) -> dict[str, Any]:
        me = self.me()
        url = me.url
        if url:
            # A wildcard bind is reachable at the host's name, not at 0.0.0.0.
            for wildcard in ("//0.0.0.0:", "//[::]:"):
                url = url.replace(wildcard, f"//{me.host}:")
        entry = replace(me, url=url).to_wire()
        # The store has no authentication: the CLI dials an entry only if the job's token
        # signed it (probe_protocol/tokens.py).
        return sign_entry(self.token, entry) if self.token else entry

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
                self._publish()
            self._read()
            self.failures, self.last_error = 0, None  # the store answers (again)
            complete = self.peers >= self.world_size
            self._next = now + (self.refresh_s if complete else _TICK_S)
        except Exception as e:  # store down or gone: serve ourselves, retry later
            self.failures += 1
            first_line = (str(e).strip().splitlines() or [""])[0][:300]
            self.last_error = f"{type(e).__name__}: {first_line}"
            if self.failures == 1:
                log.warning(
                    "probe agent on rank %d: cannot use the job's c10d store for rank "
                    "discovery (%s); this agent serves itself only, pass -t for the others",
                    self.me().rank, self.last_error,
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
        self.on_group(dist.get_rank(), dist.get_world_size())
        self.world_size = dist.get_world_size()
        self.store = dist.PrefixStore(STORE_PREFIX, base)

    def _publish(self) -> None:
        entry = self.entry()
        self._mine = json.dumps(entry).encode()
        self.store.set(f"rank{entry['rank']}", self._mine)
        self.store.add(GENERATION_KEY, 1)
        self.published = True

    def _get(self, key: str) -> bytes | None:
        """The value of ``key``, or None when absent or oversized (then deleted: whoever wrote
        it, it is not an entry of ours, and it would otherwise be read again)."""
        if not self.store.check([key]):  # a get on a missing key would wait for it
            return None
        raw = bytes(self.store.get(key))
        if len(raw) > MAX_ENTRY_BYTES:
            self.dropped += 1
            log.warning("probe agent: deleted %s from the job's c10d store (%d bytes; an entry "
                        "is under %d): someone else wrote it", key, len(raw), MAX_ENTRY_BYTES)
            self.store.delete_key(key)
            return None
        return raw

    def _read(self) -> None:
        me = self.me().rank
        # Our own entry first: rewritten, inflated or deleted by someone else -> publish again.
        if self._get(f"rank{me}") != self._mine:
            self.republished += 1
            log.warning("probe agent on rank %d: its entry in the job's c10d store was changed "
                        "by someone else; published again", me)
            self._publish()
        generation = int(self.store.add(GENERATION_KEY, 0))
        if generation == self._generation and len(self._entries) >= self.world_size:
            return  # nobody published since the last read: the entries we hold still stand
        entries: dict[int, RankEntry] = {}
        for rank in range(self.world_size):
            if rank == me:
                entry = RankEntry.from_wire(json.loads(self._mine or b"{}"))
            else:
                entry = self._parse(rank, self._get(f"rank{rank}"))
            if entry is not None:
                entries[rank] = entry
        self._generation, self._entries = generation, entries
        self.peers = len(entries)
        self.on_peers(dict(entries))

    def _parse(self, rank: int, raw: bytes | None) -> RankEntry | None:
        if raw is None:
            return None
        try:
            entry = RankEntry.from_wire(json.loads(raw.decode()))
        except (ValueError, AttributeError, TypeError):
            entry = None
        if entry is None or entry.rank != rank:
            self.dropped += 1
            log.debug("probe agent: ignoring a malformed store entry for rank %d", rank)
            return None
        return entry
