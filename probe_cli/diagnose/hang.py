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
no answer in time). The headline leads with the culprit (``HANG: rank 1 never reached
all_reduce #26; it is in do_hang (train.py:101). 1 rank waits for it, for 11.9 s``): with 511
waiters and one culprit, the culprit is the news.

"Waiting" is measured against the job's own rhythm (``normal_wait``): the gaps between its
collective starts, so a job with 8 s steps is not hung after 5 s and a job with 1 s steps that
stops is called hung within a few steps. Each verdict says how confident it is and on what it
rests (``confidence``, ``basis``).

JSON (``HangVerdict.to_json``, stable; `probe hang --json` and the dashboard): ``problem``,
``headline``, ``details``, ``culprits`` (Verdict's), then ``waiting`` ({pg, seq, op, ranks,
age_s} or null), ``confidence`` ("high" | "medium" | "low"), ``basis`` (text) and
``threshold_s`` (the wait that counted as stuck).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..group import rank_label
from .hang_state import RankState
from .loader_workers import loader_place
from .mismatch import Mismatch, find_mismatch
from .rhythm import MIN_GAPS, WaitRule, normal_wait
from .verdict import Verdict

#: Frames from these path fragments are library internals, not "where the rank is".
_LIBRARY = (os.sep + "site-packages" + os.sep, os.sep + "lib" + os.sep + "python",
            os.sep + "probe_agent" + os.sep)
_DATALOADER = os.sep + os.path.join("torch", "utils", "data") + os.sep


@dataclass(slots=True)
class HangVerdict(Verdict):
    #: the collective most ranks wait in: {pg, seq, op, ranks, age_s}; None without a hang.
    waiting: dict[str, Any] | None = None
    #: "high", "medium" or "low", and what the verdict rests on (one sentence).
    confidence: str = "medium"
    basis: str = ""
    #: seconds in a collective that counted as stuck (the job's own rhythm, or --min-wait).
    threshold_s: float | None = None
    #: ranks the verdict blames only because their collectives read timed out (the GIL is
    #: held, or the node is busy): doctor checks them against their steps (time_checks.py).
    gil_suspects: tuple[int, ...] = ()
    #: the calls that met in one collective and differ (mismatch.py's ``to_json``), or None.
    mismatch: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {**Verdict.to_json(self), "waiting": self.waiting, "confidence": self.confidence,
                "basis": self.basis, "threshold_s": self.threshold_s,
                "mismatch": self.mismatch}


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


def in_dataloader(frames: tuple[dict[str, Any], ...]) -> bool:
    """The main thread waits in torch.utils.data (for a batch, at a DataLoader's next)."""
    return any(_DATALOADER in str(f.get("file")) for f in frames)


def where(frames: tuple[dict[str, Any], ...], limit: int = 3,
          children: tuple[dict[str, Any], ...] = ()) -> tuple[str, list[str]]:
    """A one-phrase place ("in the DataLoader") and the top frames worth showing; with the
    rank's ``children`` read (its watchdog's), the DataLoader worker it waits for and where
    that worker is (loader_workers.py)."""
    shown = [f for f in frames if (os.sep + "probe_agent" + os.sep) not in str(f.get("file"))]
    if not shown:
        return "somewhere unknown (no main-thread frames)", []
    user = [f for f in shown if not any(p in str(f.get("file")) for p in _LIBRARY)]
    top = shown[:limit]
    if user and user[0] not in top:
        top = [*shown[: limit - 1], user[0]]
    lines = [_frame(f) for f in top]
    if in_dataloader(tuple(shown)):
        found = loader_place(children)
        if found is not None:
            return found[0], [*lines, *found[1]]
        return "in the DataLoader, waiting for a batch", lines
    inner = shown[0]
    if inner.get("func") == "sleep":
        return "sleeping", lines
    anchor = user[0] if user else inner
    return f"in {anchor.get('func')} ({os.path.basename(str(anchor.get('file')))}:" \
           f"{anchor.get('lineno')})", lines


def oldest_pending(state: RankState, min_wait_s: float) -> dict[str, Any] | None:
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


def _confidence(rule: WaitRule, age: float, located: bool) -> str:
    if rule.gaps >= 4 * MIN_GAPS and age >= 2 * rule.wait_s and located:
        return "high"
    if rule.gaps >= MIN_GAPS and age >= rule.wait_s:
        return "medium"
    return "low"


def _explain(r: int, s: RankState | None, w: dict[str, Any] | None, key: tuple[str, Any],
             op: str | None, label: str, failed: dict[int, dict[str, Any]]) -> tuple[str, list[str],
                                                                              bool]:
    """Why rank ``r`` is not waiting at ``key``: (headline phrase, detail lines, located)."""
    if s is None:
        return f"rank {r} is in the group but was not asked", [
            f"rank {r} is in the group but was not asked (not in the target list)"], False
    if not s.answered:
        why = _silent_reason(s)
        return f"rank {r} {why}", [f"rank {r} {why}"], False
    place, frames = where(s.frames, children=s.children)
    stack = [f"    {line}" for line in frames]
    if w is not None and (str(w.get("pg")), w.get("seq")) == key:
        phrase = (f"rank {r} calls {_label(w)} where the others call {op} "
                  f"(at {_short_site(w.get('callsite'))}): the code paths diverged")
        return phrase, [phrase, *stack], True
    if w is not None:
        phrase = (f"rank {r} waits in {_label(w)} of {_group(w)} instead "
                  f"(at {_short_site(w.get('callsite'))})")
        return phrase, [phrase, *stack], True
    if r in failed:
        f = failed[r]
        phrase = f"rank {r}: {_label(f)} failed: {f.get('error')}"
        return phrase, [phrase, *stack], True
    phrase = f"rank {r} never reached {label}; it is {place}"
    if s.coll_error:
        how = (f"its agent did not answer /v1/collectives ({s.coll_error}: its GIL is "
               "probably held); the stack was read from outside the process"
               + (f" ({s.route})" if s.route else ""))
    else:
        last = _last_done(s, key[0])
        how = f"last done: {_label(last)}" if last else "no collective done yet"
    return phrase, [f"{phrase} ({how})", *stack], bool(s.frames)


def diagnose(states: list[RankState], min_wait_s: float | None = None) -> HangVerdict:
    """The verdict for one moment of the job. A collective counts as a wait once it is older
    than the job's own normal gap between collectives allows (``normal_wait``), or than
    ``min_wait_s`` when given (a healthy job is in some all_reduce at any instant)."""
    answered = [s for s in states if s.answered]
    silent = [s for s in states if not s.answered]
    by_rank = {s.rank: s for s in states}
    rule = normal_wait(answered, min_wait_s)
    waits = {s.rank: w for s in answered if (w := oldest_pending(s, rule.wait_s)) is not None}
    # A failure counts only while it is the rank's latest collective (no later success).
    failed = {s.rank: s.collectives[-1] for s in answered
              if s.collectives and s.collectives[-1].get("state") == "failed"}

    if not answered:
        return HangVerdict(True, f"no rank answered ({len(states)} tried)",
                           [f"rank {s.rank} {_silent_reason(s)}" for s in silent],
                           [s.rank for s in silent], confidence="low",
                           basis="no rank answered: nothing to compare")

    # A rank whose Python has not run for less than the job's own stuck threshold is on a busy
    # node, not held: on 2 overloaded cores healthy ranks' heartbeats pass the watchdog's 1 s
    # deadline, and "HANG ... for 0.2 s" was printed for a healthy DataLoader job.
    stuck = [s for s in answered if s.coll_error and
             (s.gil_age_s is None or s.gil_age_s >= rule.wait_s)]
    if stuck and not waits:
        # A rank whose Python does not run (its GIL is held: the watchdog answered for it) is
        # evidence enough: the others' pending collectives, however young, wait for it.
        waits = {s.rank: w for s in answered
                 if not s.coll_error and (w := oldest_pending(s, 0.0)) is not None}
        if waits:
            rule = WaitRule(0.0, f"{_ranks_word([s.rank for s in stuck])}'s Python has not run "
                            "in time to answer (its GIL is held; read from outside)", rule.gaps)

    unjoined = [s for s in answered if s.unjoined_pid is not None]
    if unjoined and not waits:
        return _unjoined_verdict(unjoined, answered, rule)

    mismatch = (find_mismatch({s.rank: s.collectives for s in answered})
                if waits or failed or silent or stuck else None)
    if mismatch is not None and (mismatch.kind != "op" or not waits):
        return _mismatch_verdict(mismatch, by_rank, failed, silent, rule)

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
        odd = [r for r in members if r not in waiting]
        phrases, details, located = [], [], True
        for r in odd:
            phrase, lines, loc = _explain(r, by_rank.get(r), waits.get(r), (pg, seq), op, label,
                                          failed)
            phrases.append(phrase)
            details.extend(lines)
            located = located and loc
        n = len(waiting)
        who = "it" if len(odd) == 1 else "them"
        wait_part = (f"{n} rank{'s' if n != 1 else ''} {'waits' if n == 1 else 'wait'} for "
                     f"{who}, for {age:.1f} s")
        if not odd:
            headline = (f"HANG: {_ranks_word(waiting)} wait in {label} ({_group(sample)}) for "
                        f"{age:.1f} s; every member is in it (a peer outside the group, or "
                        "the transport)")
        elif len(odd) == 1:
            headline = f"HANG: {phrases[0]}. {wait_part}"
        else:
            headline = (f"HANG: {_ranks_word(odd)} never joined {label}; {phrases[0]} (and "
                        f"{len(odd) - 1} more below). {wait_part}")
        conf = _confidence(rule, age, located and bool(odd))
        basis = (f"{_ranks_word(waiting)} {'has' if n == 1 else 'have'} waited {age:.1f} s in "
                 f"{label}; {rule.basis}")
        site = _short_site(sample.get("callsite"))
        details = [f"{_ranks_word(waiting)} {'waits' if n == 1 else 'wait'} in {label} "
                   f"({_group(sample)}) at {site}", *details,
                   *(mismatch.details() if mismatch is not None else ()),
                   f"confidence: {conf}; based on: {basis}"]
        return HangVerdict(True, headline, details, odd,
                           {"pg": pg, "seq": seq, "op": op, "ranks": waiting,
                            "age_s": round(age, 3)},
                           confidence=conf, basis=basis, threshold_s=round(rule.wait_s, 3),
                           gil_suspects=tuple(s.rank for s in stuck if s.rank in odd),
                           mismatch=mismatch.to_json() if mismatch is not None else None)

    if stuck and not (failed or silent):
        # No rank is seen waiting (the others' collectives are unknown or young), but a rank's
        # Python does not run: its GIL is held. Name it with the stack read from outside.
        details = []
        for s in stuck:
            place, frames = where(s.frames, children=s.children)
            details += [f"rank {s.rank} is {place}; its agent did not answer /v1/collectives "
                        f"({s.coll_error})", *(f"    {line}" for line in frames)]
        basis = "the rank's Python did not run in time to answer (read from outside)"
        return HangVerdict(True, f"STUCK: {_ranks_word([s.rank for s in stuck])} "
                           f"{'does' if len(stuck) == 1 else 'do'} not run Python; "
                           f"{details[0].split(';')[0]}", details, [s.rank for s in stuck],
                           confidence="low", basis=basis, threshold_s=round(rule.wait_s, 3),
                           gil_suspects=tuple(s.rank for s in stuck))

    if failed or silent:
        # Failed collectives are usually the survivors' view of a silent peer: blame the peer.
        culprits = sorted(s.rank for s in silent) or sorted(failed)
        details = [f"rank {s.rank} {_silent_reason(s)}" for s in silent]
        for r, f in sorted(failed.items()):
            place, frames = where(by_rank[r].frames, children=by_rank[r].children)
            details.append(f"rank {r}: {_label(f)} failed: {f.get('error')}; it is now {place}")
        parts = []
        if len(silent) == 1:  # the culprit first, with what is known of it
            parts.append(f"rank {silent[0].rank} {_silent_reason(silent[0])}")
        elif silent:
            parts.append(f"{_ranks_word([s.rank for s in silent])} did not answer")
        if failed:
            parts.append(f"a collective failed on {_ranks_word(sorted(failed))}")
        dead = any(s.dead for s in silent)
        basis = ("the rank's process is gone" if dead else
                 "no answer in time" if silent else "a failed collective")
        return HangVerdict(True, "PROBLEM: " + "; ".join(parts), details, culprits,
                           confidence="high" if dead or failed else "medium", basis=basis,
                           threshold_s=round(rule.wait_s, 3))

    return HangVerdict(False, f"no hang: none of {len(answered)} ranks has waited "
                       f"{rule.wait_s:.1f} s or more in a collective", [f"based on: {rule.basis}"],
                       confidence="high" if rule.gaps >= MIN_GAPS else "medium",
                       basis=rule.basis, threshold_s=round(rule.wait_s, 3))


_INIT_FUNCS = ("init_process_group", "rendezvous", "_store_based_barrier", "barrier",
               "next_rendezvous", "_rendezvous_helper")


def _in_init(frames: tuple[dict[str, Any], ...]) -> dict[str, Any] | None:
    """The frame of ``init_process_group`` (or the rendezvous under it) on the stack, if any."""
    return next((f for f in frames if f.get("func") in _INIT_FUNCS and "distributed" in
                 str(f.get("file"))), None)


def _unjoined_verdict(unjoined: list[RankState], answered: list[RankState],
                      rule: WaitRule) -> HangVerdict:
    """Ranks whose agent answers but that never registered: they never reached (or never
    finished) ``init_process_group``; the others wait for them there."""
    details, phrases = [], []
    for s in unjoined:
        place, frames = where(s.frames, children=s.children)
        at_init = _in_init(s.frames)
        what = ("is inside init_process_group and never finished it" if at_init else
                "never reached init_process_group")
        phrase = (f"rank {s.rank} {what}; it is {place} (its agent is up, pid {s.unjoined_pid}, "
                  "found through this machine's run dir, not in the job's rank list)")
        phrases.append(phrase)
        details += [phrase, *(f"    {line}" for line in frames)]
    waiting = [s.rank for s in answered if s.unjoined_pid is None and _in_init(s.frames)]
    others = [s.rank for s in answered if s.unjoined_pid is None and s.rank not in waiting]
    if waiting:
        details.insert(0, f"{_ranks_word(waiting)} {'waits' if len(waiting) == 1 else 'wait'} "
                       "in init_process_group for the rest of the job")
    if others:
        details.append(f"{_ranks_word(others)} answered and are not in init_process_group")
    wait_part = (f". {len(waiting)} rank{'s' if len(waiting) != 1 else ''} "
                 f"{'waits' if len(waiting) == 1 else 'wait'} for "
                 f"{'it' if len(unjoined) == 1 else 'them'} in init_process_group"
                 if waiting else "")
    head = phrases[0].split(" (its agent")[0] if len(unjoined) == 1 else (
        f"{_ranks_word([s.rank for s in unjoined])} never joined the process group")
    basis = ("the rank's own agent answers (its socket in the run dir) but the job's rank "
             "list does not name it; its main thread's stack")
    details.append(f"confidence: high; based on: {basis}")
    return HangVerdict(True, f"HANG: {head}{wait_part}", details,
                       [s.rank for s in unjoined], None, confidence="high", basis=basis,
                       threshold_s=round(rule.wait_s, 3))


def _mismatch_verdict(m: Mismatch, by_rank: dict[int, RankState],
                      failed: dict[int, dict[str, Any]], silent: list[RankState],
                      rule: WaitRule) -> HangVerdict:
    """The calls that met in one collective differ: that is the news, whether the ranks still
    wait in it, its call failed (the backend checked the sizes), or a rank was aborted."""
    details = m.details()
    for r, f in sorted(failed.items()):
        if (str(f.get("pg")), f.get("seq")) == (m.pg, m.seq):
            details.append(f"rank {r}: {_label(f)} failed: {str(f.get('error'))[:200]}")
    for s in silent:
        details.append(f"rank {s.rank} {_silent_reason(s)}")
    for side in m.sides:
        for r in side.ranks:
            state = by_rank.get(r)
            if state is not None and state.frames:
                place, frames = where(state.frames, children=state.children)
                details += [f"rank {r} is {place}", *(f"    {line}" for line in frames)]
    waiting = [r for i, side in enumerate(m.sides) if i != m.odd for r in side.ranks]
    ages = [by_rank[r].now - float(row.get("start_time") or by_rank[r].now)
            for r in waiting if r in by_rank
            for row in by_rank[r].collectives
            if (str(row.get("pg")), row.get("seq")) == (m.pg, m.seq)]
    basis = (f"ranks met in #{m.seq} of group {m.pg} with different calls (the collectives "
             f"table of every rank); {m.why_odd}")
    conf = "high" if m.odd is not None else "medium"
    details.append(f"confidence: {conf}; based on: {basis}")
    op = m.sides[1 - m.odd].op if m.odd is not None and len(m.sides) == 2 else m.sides[0].op
    return HangVerdict(True, m.headline(), details, m.culprits,
                       {"pg": m.pg, "seq": m.seq, "op": op, "ranks": sorted(waiting),
                        "age_s": round(max(ages), 3) if ages else None},
                       confidence=conf, basis=basis, threshold_s=round(rule.wait_s, 3),
                       mismatch=m.to_json())
