"""Session: the group options of one `probe` invocation, shared by every command.

main.py builds it from the command line and puts it on ``ctx.obj``; commands receive it with
``@pass_session``. It owns the rank clients (one per agent address or post-mortem copy, reused
between rank discovery and the command's own requests) and closes them when the command ends.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .client import ProbeClient
from .rank_client import RankClient, live
from .targets import Endpoint

if TYPE_CHECKING:
    from .postmortem import PostmortemClient

#: ``progress(done, total)`` while waiting; ``progress(total, total)`` once more at the end.
Progress = Callable[[int, int], None]


def _no_progress(done: int, total: int) -> None:
    return None


@dataclass(kw_only=True)
class Session:
    """Everything a command needs to reach the ranks and to shape its output."""

    endpoints: list[Endpoint]
    """The agents named on the command line (or the default one); at least one."""
    rank_filter: list[int] | None = None
    """``--rank``: only these ranks. None reaches every rank the targets know of."""
    timeout: float = 5.0
    """Seconds each rank gets for each request; slower ranks are reported as silent."""
    token: str | None = None
    cacert: str | None = None
    """``--cacert``: the CA bundle https agents' certificates must chain to."""
    output: str = "text"
    """``text`` (tables for people), ``json`` or ``csv``."""
    colour: bool = False
    """Decided once in main.py (TTY, NO_COLOR, FORCE_COLOR, --no-color)."""
    target_note: str | None = None
    """How the target was chosen when none was given; added to errors about it."""
    progress: Progress = _no_progress
    """Called from the main thread as answers arrive; a no-op unless stderr is a TTY."""
    raw: bool = False
    """``--raw``: the agents' strings keep their control characters (untrusted_text.py)."""
    run_dir: str | None = None
    unjoined: dict[int, int] = field(default_factory=dict)
    """rank -> pid of ranks whose agent is up on this machine but not in the job's rank list
    (they never joined the process group: transport/unjoined.py)."""
    """``--run-dir`` (or $PROBE_RUN_DIR, else the default): where local agents and the
    post-mortem copies are looked for."""
    _clients: dict[Endpoint, ProbeClient | PostmortemClient] = field(default_factory=dict,
                                                                     repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    rank_cache: list | None = field(default=None, repr=False)
    """Set by fanout.resolve_ranks so a command that sends two requests discovers once."""
    notes: list[str] = field(default_factory=list)
    """Warnings about how the ranks were found (say, ranks missing from discovery); main.py
    prints them on stderr once the command has run."""

    def client(self, endpoint: Endpoint) -> RankClient:
        """The (cached) client for ``endpoint``: the live one, or a post-mortem copy's reader
        (what every read command needs); safe to call from fan-out threads."""
        with self._lock:
            c = self._clients.get(endpoint)
            if c is None and endpoint.postmortem is not None:
                from probe_protocol import postmortem as layout

                from .postmortem import PostmortemClient, find_job

                job = find_job(os.path.dirname(endpoint.postmortem))
                rank = layout.rank_of(os.path.basename(endpoint.postmortem))
                c = self._clients[endpoint] = PostmortemClient(job.ranks[rank or 0],
                                                               raw=self.raw)
            elif c is None:
                c = self._clients[endpoint] = ProbeClient(
                    endpoint, token=self.token, timeout=self.timeout, cacert=self.cacert,
                    raw=self.raw)
            return c

    def live_client(self, endpoint: Endpoint, method: str) -> ProbeClient:
        """``client(endpoint)`` for ``method``, which only a live rank answers; a post-mortem
        copy raises a ``RankError`` saying so (rank_client.live)."""
        return live(self.client(endpoint), method)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()
