"""What one rank told ``probe hang`` (or that it told nothing): ``RankState``, and
``rank_state``, which reads it from the rank's answer on the wire (its backtrace, its collectives,
or the failure and what its watchdog said of it). The verdict (hang.py) only reads these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from probe_protocol.bodies import BacktraceBody, CollectivesBody

from ..errors import AgentUnreachableError
from ..result import RankResult


@dataclass(frozen=True, slots=True)
class RankState:
    """What one rank told us (or that it told us nothing).

    Args:
        error: why the rank gave no usable answer; None when it answered.
        dead: the connection was refused (nothing listens: the process is gone).
        frames: main-thread frames, innermost first (``/v1/backtrace`` frame dicts).
        collectives: ``/v1/collectives`` rows, oldest first.
        now: the rank's clock when it answered, to age its pending collectives.
        coll_error, route: see the fields.
    """

    rank: int
    error: str | None = None
    dead: bool = False
    frames: tuple[dict[str, Any], ...] = ()
    collectives: tuple[dict[str, Any], ...] = ()
    now: float = 0.0
    #: the backtrace answered but /v1/collectives did not (its GIL is held): why.
    coll_error: str | None = None
    #: with ``coll_error``: how long its Python had not run, as its watchdog said (None: not
    #: said). Shorter than the job's stuck threshold, it is a busy node, not a held GIL.
    gil_age_s: float | None = None
    #: which route read the stack ("watchdog": from outside the process), when it says.
    route: str | None = None
    #: its agent is up on this machine but not in the job's rank list: it never joined the
    #: process group (transport/unjoined.py); the pid.
    unjoined_pid: int | None = None
    #: its child processes (DataLoader workers) as its watchdog read them, asked for only when
    #: its main thread waits in the DataLoader (``?children=1``); () when not read.
    children: tuple[dict[str, Any], ...] = ()

    @property
    def answered(self) -> bool:
        return self.error is None


def rank_state(r: RankResult) -> RankState:
    """What one rank's answer to ``probe hang``'s round (``{"backtrace": ..., "collectives":
    ...}``, or its failure) says about it. A rank whose watchdog reports it dead is
    dead, as is one that refuses connections (nothing listens)."""
    rank = r.rank if r.rank is not None else -1
    if not r.ok or r.data is None:
        err = r.error
        reason = getattr(err, "reason", None) or str(err)
        dead = isinstance(err, AgentUnreachableError) and reason == "connection refused"
        body = BacktraceBody.from_wire(getattr(err, "body", None))
        if body.state == "dead":  # its watchdog reports the death
            cause = (body.exit or {}).get("description") or "exited"
            at = f" at step {body.last_step}" if body.last_step is not None else ""
            return RankState(rank, error=f"is dead: {cause}{at} (its watchdog reports it)",
                             dead=True)
        return RankState(rank, error=reason, dead=dead)
    bt = BacktraceBody.from_wire(r.data["backtrace"])
    if bt.state == "dead":  # the watchdog answered for a rank that is gone
        cause = (bt.exit or {}).get("description") or "exited"
        at = f" at step {bt.last_step}" if bt.last_step is not None else ""
        return RankState(rank, error=f"is dead: {cause}{at} (its watchdog reports it)",
                         dead=True)
    # Only a thread marked main: a stack from another thread would put the rank somewhere false.
    main = next((t for t in bt.threads if t.get("is_main")), None)
    frames = tuple(main.get("frames", ())) if main else ()
    kids = bt.children or ()
    if r.data.get("collectives") is None:  # backtrace from the watchdog, collectives timed out
        age = r.data.get("collectives_heartbeat_age_s")
        return RankState(rank, frames=frames, coll_error=r.data.get("collectives_error") or
                         "no answer", route=bt.route or bt.source, children=kids,
                         gil_age_s=float(age) if isinstance(age, int | float) else None)
    coll = CollectivesBody.from_wire(r.data["collectives"])
    return RankState(rank, frames=frames, collectives=coll.collectives, now=coll.now,
                     route=bt.route or bt.source, children=kids)
