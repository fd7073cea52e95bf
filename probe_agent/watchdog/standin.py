"""The answers the watchdog gives in the agent's place, built from what it knows without it.

- a backtrace read from outside (reader.py) while the agent does not answer: ``source:
  "out-of-process"``, with the route, the reason and the GIL holder;
- a dead rank: ``/v1/backtrace`` 200 with ``state: "dead"`` and the last stack, every other
  route 410 with the cause (rank.py's forensics);
- ``/v1/ranks`` from the agent's last answer (kept here), so that ``probe -t this-rank ...``
  still reaches every other rank while this one is frozen or dead.

Separate from proxy.py, which decides *when* to answer for the agent (deadlines, heartbeat,
liveness); this module decides *what* those answers say, and needs no connection to anyone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any

from probe_protocol.bodies import BacktraceBody, RankEntry, RanksBody

from ..redact import redact_locals
from .httpwire import Request, error_response, json_response
from .rank import RankWatch
from .reader import ReadError, StackReader


class StandIn:
    """Answers for rank ``rank_no`` (process ``pid`` on ``host``).

    Args:
        rank: its liveness, heartbeat, last step and, once dead, its exit and last backtrace.
        reader: reads its stacks from outside; the thread names it learns are kept on it, so a
            later read of a frozen rank still names them.
    """

    def __init__(self, rank_no: int, pid: int, host: str | None, rank: RankWatch,
                 reader: StackReader) -> None:
        self.rank_no = rank_no
        self.pid = pid
        self.host = host
        self.rank = rank
        self.reader = reader
        #: The agent's last /v1/ranks answer: served while it is frozen or dead.
        self.ranks_cache: RanksBody | None = None
        #: The same list as sent (signatures included), for the node route (nodefan.py).
        self.ranks_raw: list[dict[str, Any]] | None = None

    # -- the ranks ----------------------------------------------------------------------------
    def remember_ranks(self, data: bytes) -> None:
        """Keep a /v1/ranks answer as relayed (bytes); one that is not JSON is ignored."""
        try:
            self.remember(json.loads(data))
        except ValueError:
            return

    def remember(self, body: Any) -> None:
        """Keep a /v1/ranks body if it is a successful one (None and errors are ignored)."""
        if isinstance(body, dict) and body.get("ok") and isinstance(body.get("ranks"), list):
            self.ranks_cache = RanksBody.from_wire(body)
            self.ranks_raw = [e for e in body["ranks"] if isinstance(e, dict)]

    def known_ranks(self) -> dict[str, Any]:
        """/v1/ranks while the agent does not answer: its last answer, else this rank alone
        (the CLI keeps the address it used for the answering rank, so no URL is needed)."""
        if self.ranks_cache:
            return replace(self.ranks_cache, cached=True).to_wire()
        me = RankEntry(self.rank_no, None, self.host, self.pid)
        return RanksBody(self.rank_no, (me,), cached=True, discovery={
            "state": "unknown", "error": "the agent did not answer in time"}).to_wire()

    # -- a live rank whose agent does not answer ----------------------------------------------
    async def out_of_process(self, req: Request, reason: str, started: float,
                             children: Awaitable[list[dict[str, Any]]] | None = None) -> bytes:
        """The backtrace read from outside; ``reason`` says why the agent's was not used;
        ``children``, when asked for, the rank's children being read (children.py)."""
        native, want_locals, show_all = req.flag("native"), req.flag("locals"), req.flag("all")
        try:
            res = await self.reader.read(locals=want_locals, native=native)
        except ReadError as e:
            return error_response(self.rank_no, 503, f"rank {self.rank_no}: {reason}, and its "
                                  f"stacks could not be read from outside: {e}",
                                  source="out-of-process")
        threads = [t for t in res["threads"] if show_all or not t.get("is_agent")]
        show_secrets = req.flag("secrets")
        for t in threads:  # py-spy's locals get the agent's redaction too
            for f in t.get("frames") or ():
                f["locals"] = redact_locals(f.get("locals"), show_secrets)
        threads.sort(key=lambda t: (not t.get("is_main"), bool(t.get("is_agent")),
                                    str(t.get("thread_name"))))
        for t in threads:
            if isinstance(t.get("thread_id"), int) and t.get("thread_name"):
                self.reader.names.setdefault(t["thread_id"], t["thread_name"])
        holder = next((t for t in threads if t.get("thread_id") == res.get("gil_holder")), None)
        if res.get("gil_holder") is not None and "GIL" not in reason:
            name = f" ({holder['thread_name']})" if holder else ""
            reason = f"{reason}; the GIL is held by thread {res['gil_holder']}{name}"
        if res.get("note"):
            reason = f"{reason}; route {res['route']} because {res['note']}"
        if res.get("stopped") and res["stopped"] not in reason:
            reason = f"{res['stopped']}; {reason}"
        hb = self.rank.heartbeat()
        return json_response(200, BacktraceBody(
            self.rank_no, pid=self.pid, host=self.host,
            source="out-of-process", route=res["route"], reason=reason,
            native=native and res["route"] == "py-spy" and not res.get("stopped"),
            state="stopped" if res.get("stopped") else "alive", stopped=res.get("stopped"),
            gil_holder=res.get("gil_holder"),
            gil_held=res.get("gil_holder") is not None if res["route"] == "py-spy" else None,
            heartbeat_age_s=round(hb[0], 3) if hb else None,
            step=self.rank.last_step, threads=tuple(threads),
            children=tuple(await children) if children is not None else None,
            elapsed_ms=round((time.monotonic() - started) * 1e3, 3),
        ).to_wire())

    # -- a dead rank --------------------------------------------------------------------------
    def dead(self, req: Request, is_backtrace: bool) -> bytes:
        """The answer to ``req`` once the rank has died: its last stack, or a 410."""
        e = self.rank.exit or {}
        ago = time.time() - (self.rank.died_at or time.time())
        step = self.rank.last_step
        last = self.rank.last_backtrace
        facts: dict[str, Any] = {"state": "dead", "pid": self.pid, "host": self.host, "exit": e,
                                 "last_step": step, "died_at": self.rank.died_at,
                                 "last_backtrace": last}
        at = f" at step {step}" if step is not None else ""
        message = (f"rank {self.rank_no} (pid {self.pid}) is dead: {e.get('description')}{at}, "
                   f"{ago:.0f} s ago")
        if is_backtrace:
            threads = [t for t in (last or {}).get("threads") or []
                       if req.flag("all") or not t.get("is_agent")]
            return json_response(200, BacktraceBody(
                self.rank_no, source="watchdog", route=(last or {}).get("route"),
                reason=message, **facts, threads=tuple(threads)).to_wire())
        return error_response(self.rank_no, 410,
                              message + "; `probe backtrace` shows its last stack", **facts)
