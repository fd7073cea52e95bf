"""The hang verdict: pure functions from every rank's collective state and main-thread stack to a
diagnosis (``diagnose``), a ``Verdict``. No I/O here; ``probe hang`` gathers, and
render/verdicts.py writes it.

The model
---------
A collective is identified across ranks by (process group, seq): the Flight Recorder numbers the
collectives of each group identically on every member. A rank blocked in one has a ``pending``
row for it. The verdict picks the (group, seq) that the most ranks wait in, then explains every
member that is not waiting there: it answered but has not reached that seq yet (and where its
main thread is instead), it waits in a different op at the same seq (the code paths diverged),
it waits in another collective, or it did not answer at all (dead: nothing listens; silent:
no answer in time).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..errors import AgentUnreachableError
from ..group import rank_label
from ..result import RankResult
from ..transport.wire import BacktraceBody, CollectivesBody
from .verdict import Verdict

#: Frames from these path fragments are library internals, not "where the rank is".
_LIBRARY = (os.sep + "site-packages" + os.sep, os.sep + "lib" + os.sep + "python",
            os.sep + "probe_agent" + os.sep)
_DATALOADER = os.sep + os.path.join("torch", "utils", "data") + os.sep


@dataclass(frozen=True, slots=True)
class RankState:
    """What one rank told us (or that it told us nothing).

    Args:
        error: why the rank gave no usable answer; None when it answered.
        dead: the connection was refused (nothing listens: the process is gone).
        frames: main-thread frames, innermost first (``/v1/backtrace`` frame dicts).
        collectives: ``/v1/collectives`` rows, oldest first.
        now: the rank's clock when it answered, to age its pending collectives.
    """

    rank: int
    error: str | None = None
    dead: bool = False
    frames: tuple[dict[str, Any], ...] = ()
    collectives: tuple[dict[str, Any], ...] = ()
    now: float = 0.0

    @property
    def answered(self) -> bool:
        return self.error is None


@dataclass(slots=True)
class HangVerdict(Verdict):
    #: the collective most ranks wait in: {pg, seq, op, ranks, age_s}; None without a hang.
    waiting: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {**Verdict.to_json(self), "waiting": self.waiting}


def _ranks_word(ranks: list[int]) -> str:
    return rank_label(ranks)


def _label(row: dict[str, Any]) -> str:
    return f"{row.get('op')} #{row.get('seq')}"


def _group(row: dict[str, Any]) -> str:
    desc = row.get("pg_desc")
    return f"group {row.get('pg')}" + (f" ({desc})" if desc and desc != "default_pg" else "")


def _short_site(site: str | None) -> str:
    if not site:
        return "?"
    path, _, rest = site.partition(":")
    return f"{os.path.basename(path)}:{rest}"


def _frame(f: dict[str, Any]) -> str:
    return f"{f.get('func')} ({os.path.basename(str(f.get('file')))}:{f.get('lineno')})"


def where(frames: tuple[dict[str, Any], ...], limit: int = 3) -> tuple[str, list[str]]:
    """A one-phrase place ("in the DataLoader") and the top frames worth showing."""
    shown = [f for f in frames if (os.sep + "probe_agent" + os.sep) not in str(f.get("file"))]
    if not shown:
        return "somewhere unknown (no main-thread frames)", []
    user = [f for f in shown if not any(p in str(f.get("file")) for p in _LIBRARY)]
    top = shown[:limit]
    if user and user[0] not in top:
        top = [*shown[: limit - 1], user[0]]
    lines = [_frame(f) for f in top]
    if any(_DATALOADER in str(f.get("file")) for f in shown):
        return "in the DataLoader, waiting for a batch", lines
    inner = shown[0]
    if inner.get("func") == "sleep":
        return "sleeping", lines
    anchor = user[0] if user else inner
    return f"in {anchor.get('func')} ({os.path.basename(str(anchor.get('file')))}:" \
           f"{anchor.get('lineno')})", lines


def _oldest_pending(state: RankState, min_wait_s: float) -> dict[str, Any] | None:
    pending = [r for r in state.collectives if r.get("state") == "pending"
               and state.now - float(r.get("start_time") or state.now) >= min_wait_s]
    return min(pending, key=lambda r: float(r.get("start_time") or 0.0)) if pending else None


def _last_done(state: RankState, pg: str) -> dict[str, Any] | None:
    done = [r for r in state.collectives if r.get("pg") == pg and r.get("state") == "done"
            and not r.get("is_p2p")]
    return max(done, key=lambda r: int(r.get("seq") or 0)) if done else None


def _silent_reason(s: RankState) -> str:
    if s.dead and s.error and s.error.startswith("is dead"):
        return s.error
    if s.dead:
        return f"did not answer ({s.error}): the process is gone"
    return f"did not answer ({s.error}): alive but silent, or unreachable"


def diagnose(states: list[RankState], min_wait_s: float = 5.0) -> HangVerdict:
    """The verdict for one moment of the job; ``min_wait_s`` ignores collectives younger than
    that (a healthy job is in some all_reduce at any instant)."""
    answered = [s for s in states if s.answered]
    silent = [s for s in states if not s.answered]
    by_rank = {s.rank: s for s in states}
    waits = {s.rank: w for s in answered if (w := _oldest_pending(s, min_wait_s)) is not None}
    # A failure counts only while it is the rank's latest collective (no later success).
    failed = {s.rank: s.collectives[-1] for s in answered
              if s.collectives and s.collectives[-1].get("state") == "failed"}

    if not answered:
        return HangVerdict(True, f"no rank answered ({len(states)} tried)",
                       [f"rank {s.rank} {_silent_reason(s)}" for s in silent],
                       [s.rank for s in silent])

    if waits:
        keys = Counter((str(w.get("pg")), w.get("seq")) for w in waits.values())
        (pg, seq), _ = max(keys.items(), key=lambda kv: (kv[1], -int(kv[0][1] or 0)))
        at_key = {r: w for r, w in waits.items() if (str(w.get("pg")), w.get("seq")) == (pg, seq)}
        op = Counter(w.get("op") for w in at_key.values()).most_common(1)[0][0]
        waiting = sorted(r for r, w in at_key.items() if w.get("op") == op)
        sample = at_key[waiting[0]]
        members = sample.get("group_ranks") or sorted(by_rank)
        age = max(by_rank[r].now - float(at_key[r].get("start_time") or 0.0) for r in waiting)
        label = _label(sample)
        verb = "waits" if len(waiting) == 1 else "wait"
        headline = (f"HANG: {_ranks_word(waiting)} {verb} in {label} ({_group(sample)}) for "
                    f"{age:.1f} s; ")
        details: list[str] = []
        odd: list[int] = []
        for r in members:
            if r in waiting:
                continue
            odd.append(r)
            s = by_rank.get(r)
            if s is None:
                details.append(f"rank {r} is in the group but was not asked (not in the target "
                               "list)")
                continue
            if not s.answered:
                details.append(f"rank {r} {_silent_reason(s)}")
                continue
            w = waits.get(r)
            place, frames = where(s.frames)
            if w is not None and (str(w.get("pg")), w.get("seq")) == (pg, seq):
                details.append(f"rank {r} calls {_label(w)} instead of {op} "
                               f"(at {_short_site(w.get('callsite'))}): the code paths diverged")
            elif w is not None:
                details.append(f"rank {r} waits in {_label(w)} of {_group(w)} instead "
                               f"(at {_short_site(w.get('callsite'))})")
            elif r in failed:
                f = failed[r]
                details.append(f"rank {r}: {_label(f)} failed: {f.get('error')}")
            else:
                last = _last_done(s, pg)
                done = f"last done: {_label(last)}" if last else "no collective done yet"
                details.append(f"rank {r} has not reached {label} ({done}); it is {place}")
            details.extend(f"    {line}" for line in frames)
        if not odd:
            headline += "every member is in it (a peer outside the group, or the transport)"
        else:
            headline += f"{_ranks_word(odd)} {'is' if len(odd) == 1 else 'are'} not in it"
        site = _short_site(sample.get("callsite"))
        return HangVerdict(True, headline, [f"waiting at {site}", *details], odd,
                       {"pg": pg, "seq": seq, "op": op, "ranks": waiting, "age_s": round(age, 3)})

    if failed or silent:
        # Failed collectives are usually the survivors' view of a silent peer: blame the peer.
        culprits = sorted(s.rank for s in silent) or sorted(failed)
        details = [f"rank {s.rank} {_silent_reason(s)}" for s in silent]
        for r, f in sorted(failed.items()):
            place, frames = where(by_rank[r].frames)
            details.append(f"rank {r}: {_label(f)} failed: {f.get('error')}; it is now {place}")
        parts = []
        if silent:
            parts.append(f"{_ranks_word([s.rank for s in silent])} did not answer")
        if failed:
            parts.append(f"a collective failed on {_ranks_word(sorted(failed))}")
        return HangVerdict(True, "PROBLEM: " + "; ".join(parts), details, culprits)

    return HangVerdict(False, f"no hang: none of {len(answered)} ranks has waited {min_wait_s:g} s "
                          "or more in a collective", [])


def rank_state(r: RankResult) -> RankState:
    """What one rank's answer to ``probe hang``'s round (``{"backtrace": ..., "collectives":
    ...}``, or its failure) says about it. A rank whose watchdog reports it dead (issue 5) is
    dead, as is one that refuses connections (nothing listens)."""
    rank = r.rank if r.rank is not None else -1
    if not r.ok or r.data is None:
        err = r.error
        reason = getattr(err, "reason", None) or str(err)
        dead = isinstance(err, AgentUnreachableError) and reason == "connection refused"
        body = BacktraceBody.from_wire(getattr(err, "body", None))
        if body.state == "dead":  # its watchdog reports the death (issue 5)
            cause = body.exit.get("description") or "exited"
            at = f" at step {body.last_step}" if body.last_step is not None else ""
            return RankState(rank, error=f"is dead: {cause}{at} (its watchdog reports it)",
                             dead=True)
        return RankState(rank, error=reason, dead=dead)
    threads = BacktraceBody.from_wire(r.data["backtrace"]).threads
    # Only a thread marked main: a stack from another thread would put the rank somewhere false.
    main = next((t for t in threads if t.get("is_main")), None)
    coll = CollectivesBody.from_wire(r.data["collectives"])
    return RankState(
        rank,
        frames=tuple(main.get("frames", ())) if main else (),
        collectives=coll.collectives,
        now=coll.now,
    )
