"""Step-boundary actions from the operator's side: pick the step, queue, wait, cancel.

``run_step_action`` is the whole protocol, shared by `eval --at-step/--next-step`, `lr`,
`checkpoint` and `pause` (docs/decisions/actions-and-jobs.md):

1. **Target.** ``--at-step N`` is taken as given. ``--next-step`` means *the smallest step that
   no rank has passed yet*: every rank's ``GET /v1/step`` is read and the target is
   ``max(step) + 1``, or the common step when every rank is already paused there.
2. **Queue.** One action id (the same on every rank) is POSTed to every targeted rank with the
   list of ranks taking part (the agents use it to agree that all of them reached the step).
   If any rank refuses because it is already past the target (it stepped between 1 and 2), the
   action is cancelled everywhere and, for ``--next-step``, step 1 is redone with a new target
   (up to ``RETRIES`` times, leading by 2, 4, 8 steps, so steps shorter than the CLI's round
   trip still converge). Any other refusal cancels everywhere and is reported.
3. **Wait.** Every rank is long-polled (``GET /v1/actions/ID?wait=``) until it has finished or
   ``--wait`` runs out.
4. **Never a new hang.** Ranks still waiting then get ``DELETE /v1/actions/ID``: a queued action
   is dropped, one agreeing with its peers is skipped on *every* rank. Those ranks are
   reported with the step they were at.
"""

from __future__ import annotations

import getpass
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Concatenate, ParamSpec

import httpx

from probe_protocol.actions import ActionBody, ActionRequest, StepBody

from ..errors import AgentHTTPError, AgentTimeoutError, AgentUnreachableError, RankError
from ..group import rank_label
from ..result import RankResult
from .client import ProbeClient, via
from .fanout import RankTarget, calling_live, fan_out, resolve_ranks
from .session import Session

#: --next-step retries when a rank stepped past the chosen target while it was being queued.
RETRIES = 3
TERMINAL = frozenset({"ok", "error", "cancelled", "skipped"})
#: How long, after cancelling, to wait for ranks that were agreeing to settle on "skipped".
SETTLE_S = 3.0
#: Pauses before re-sending a POST whose answer was lost (a 504 while a rank's GIL is held).
SUBMIT_RETRY_S = (0.25, 0.5, 1.0, 2.0)


class StepActionError(RankError):
    """A rank whose action did not run (or did not succeed) at the target step."""


@dataclass(slots=True)
class StepOutcome:
    """What happened on every rank: ``results`` carry each rank's final action as ``data``."""

    action_id: str
    target: int | None
    results: list[RankResult]
    notes: list[str] = field(default_factory=list)


def requested_by() -> str:
    """``user@host``, and ``via NAME`` when a program drives this CLI (`probe mcp`)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    name = via()
    return f"{user}@{socket.gethostname()}" + (f" via {name}" if name else "")


def choose_next_step(bodies: Sequence[Mapping[str, Any] | None]) -> int | None:
    """The smallest step no rank has passed: ``max + 1``; the common step if all are paused
    there. None when no rank has taken a step yet (the agents will refuse and say why).

    Args:
        bodies: every rank's ``GET /v1/step`` body.
    """
    clocks = [StepBody.from_wire(b) for b in bodies]
    steps: list[int] = [c.step for c in clocks if c.step is not None]
    if not steps:
        return None
    paused = {c.paused_at for c in clocks}
    if len(paused) == 1 and None not in paused and paused == {max(steps)}:
        return max(steps)
    return max(steps) + 1


P = ParamSpec("P")


def _send(session: Session, targets: list[RankTarget],
          method: Callable[Concatenate[ProbeClient, P], dict[str, Any]],
          *args: P.args, **kwargs: P.kwargs) -> list[RankResult]:
    """``method`` (a live-only ``ProbeClient`` method) on every target; the answers in the
    order of ``targets`` (fan_out sorts by rank)."""
    if not targets:
        return []
    answers = fan_out(session, targets, calling_live(method, *args, **kwargs))
    by_url = {r.url: r for r in answers}
    return [by_url[t.endpoint.label] for t in targets]


def _raw(r: RankResult) -> dict[str, Any]:
    if r.data is not None:
        return r.data
    if isinstance(r.error, AgentHTTPError):
        return r.error.body
    return {}


def _body(r: RankResult) -> ActionBody:
    """The action answer of a rank, or of its refusal (a 409's error body carries ``reason``)."""
    return ActionBody.from_wire(_raw(r))


def run_step_action(
    session: Session, request: ActionRequest, *, at_step: int | None, wait_s: float,
) -> StepOutcome:
    """Queue ``request`` (without id/step) on every rank; see module doc."""
    targets = resolve_ranks(session)
    reachable = [t for t in targets if t.error is None]
    unreachable = [RankResult(t.rank, t.endpoint.label, False, None, t.error) for t in targets
                   if t.error is not None]
    if unreachable:  # an action on some ranks only is exactly what must not happen
        return StepOutcome("", at_step, unreachable + _skipped(reachable, "not queued: other "
                           "ranks are unreachable"), ["probe: nothing was queued on any rank"])
    ranks = [t.rank for t in targets]
    group = sorted(r for r in ranks if r is not None) if None not in ranks else None
    for attempt in range(RETRIES + 1):
        target = at_step
        if target is None:
            steps = _send(session, targets, ProbeClient.step)
            bad = [r for r in steps if not r.ok]
            if bad:
                return StepOutcome("", None, steps, [
                    "probe: cannot choose the next step without every rank's step; nothing was "
                    "queued"])
            target = choose_next_step([_raw(r) for r in steps])
            if target is not None and attempt:
                # Steps faster than our round trip: lead by 2, 4, 8 steps on the retries.
                target += 2 ** attempt - 1
        action_id = uuid.uuid4().hex[:12]
        body = replace(request, id=action_id, step=target, group=group,
                       requested_by=requested_by())
        posted = _submit(session, targets, body)
        if all(r.ok for r in posted):
            return _wait(session, targets, action_id, target, wait_s)
        unknown = [t for t, r in zip(targets, posted) if not r.ok and answer_lost(r)]
        refused = [r for r in posted if not r.ok and not answer_lost(r)]
        if unknown and not refused:
            return _maybe_queued(posted, targets, unknown, action_id, target)
        queued = [t for t, r in zip(targets, posted) if r.ok]
        _cancel(session, queued + unknown, action_id)
        past = [r for r in posted if _body(r).reason == "past"]
        if past and at_step is None and attempt < RETRIES and not unknown:
            continue  # a rank stepped past the target while we queued: choose again
        note = ("probe: nothing ran" if not unknown else
                f"probe: not queued: {rank_label([r.rank for r in refused])} refused it; "
                f"{action_id} was cancelled on every rank that answered, and "
                f"{rank_label([t.rank for t in unknown])} did not answer: if the request "
                "reached it, the action is skipped there (its peers cancelled it)") + (
            f"; cancelled again on {rank_label([t.rank for t in queued])}, which had queued it"
            if queued and not unknown else "")
        return StepOutcome(action_id, target, [
            r if not r.ok else _as_failed(r, "cancelled: not every rank accepted the action")
            for r in posted
        ], [note])
    raise AssertionError("unreachable")


def answer_lost(r: RankResult) -> bool:
    """Whether a failed request may still have reached the agent (or the thing it asked about
    still be going on there): no answer in time, a gateway
    error (the watchdog's 504 while the rank's GIL is held), or a connection lost after the
    request was sent. Only a refusal from the agent itself, or a connection never made, is
    known to have queued nothing."""
    e = r.error
    if isinstance(e, AgentHTTPError):
        return e.status >= 500
    if isinstance(e, AgentTimeoutError):
        return not isinstance(e.__cause__, httpx.ConnectTimeout)
    if isinstance(e, AgentUnreachableError):
        return not isinstance(e.__cause__, httpx.ConnectError)
    return False


def _submit(session: Session, targets: list[RankTarget],
            body: ActionRequest) -> list[RankResult]:
    """POST the action to every target; a rank whose answer was lost (``_may_have_arrived``)
    gets the same body again, a few times over a few seconds. The agents treat the action id
    as an idempotency key, so a request that did arrive is answered with its action and never
    queued twice."""
    posted = _send(session, targets, ProbeClient.submit_action, body)
    for pause in SUBMIT_RETRY_S:
        again = [i for i, r in enumerate(posted) if not r.ok and answer_lost(r)]
        if not again:
            break
        time.sleep(pause)
        answers = _send(session, [targets[i] for i in again], ProbeClient.submit_action, body)
        for i, r in zip(again, answers):
            posted[i] = r
    return posted


def _maybe_queued(posted: list[RankResult], targets: list[RankTarget],
                  unknown: list[RankTarget], action_id: str, target: int | None) -> StepOutcome:
    """Some ranks queued the action and the others never answered: it is not "nothing ran".
    It stays queued: it runs at the step on every rank, or, if a silent rank never got it,
    on none (the ranks agree before running, agreement.py)."""
    silent = rank_label([t.rank for t in unknown])
    step = f"step {target}" if target is not None else "each rank's next step"
    why = (f"did not answer in time (its GIL may be held); the request may still be queued "
           f"there as {action_id}")
    results = [r if r.ok else _as_failed(r, why) for r in posted]
    queued = [t.rank for t, r in zip(targets, posted) if r.ok]
    where = f" on {rank_label(queued)}" if queued else ""
    return StepOutcome(action_id, target, results, [
        f"probe: queued as {action_id}{where}; {silent} {why}. It will run at {step} on "
        "every rank (or on none, if a rank never got it) unless you "
        f"`probe actions cancel {action_id}`"])


def _wait(session: Session, targets: list[RankTarget], action_id: str, target: int | None,
          wait_s: float) -> StepOutcome:
    deadline = time.monotonic() + wait_s
    final: dict[int, RankResult] = {}
    pending = list(targets)
    last: dict[int, RankResult] = {}
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        hold = max(0.0, min(left, session.timeout * 0.5, 2.0))
        answers = _send(session, pending, ProbeClient.action, action_id, wait=round(hold, 2))
        still = []
        for t, r in zip(pending, answers):
            last[id(t)] = r
            if r.ok and _body(r).state in TERMINAL:
                final[id(t)] = r
            else:
                still.append(t)
        pending = still
    notes = []
    if pending:
        cancelled = _cancel(session, pending, action_id)
        # Ranks that were agreeing abort on every rank; give them a moment to say "skipped".
        settle = [t for t, r in zip(pending, cancelled)
                  if _body(r).state not in TERMINAL]
        end = time.monotonic() + SETTLE_S
        while settle and time.monotonic() < end:
            answers = _send(session, settle, ProbeClient.action, action_id, wait=0.5)
            for t, r in zip(settle, answers):
                cancelled[pending.index(t)] = r
            settle = [t for t, r in zip(settle, answers)
                      if _body(r).state not in TERMINAL]
        for t, r in zip(pending, cancelled):
            final[id(t)] = r if _body(r).action else last.get(id(t), r)
        notes.append(_gave_up_note(wait_s, action_id,
                                   [(t.rank, _body(final[id(t)]).state) for t in pending]))
    results = [_finish(final[id(t)], target) for t in targets]
    return StepOutcome(action_id, target, results, notes)


def _gave_up_note(wait_s: float, action_id: str, states: list[tuple[int | None, Any]]) -> str:
    """What the cancel after ``--wait`` really did on each rank still pending: a queued or
    agreeing action is cancelled; a running one cannot be (the training thread runs it)."""
    cancelled = [r for r, s in states if s in ("cancelled", "skipped")]
    running = [r for r, s in states if s == "running"]
    other = [r for r, s in states if s not in ("cancelled", "skipped", "running")]
    parts = [f"probe: gave up waiting after {wait_s:g} s (--wait)"]
    if cancelled:
        parts.append(f"the action was cancelled on {rank_label(cancelled)}")
    if running:
        parts.append(f"it is still running on {rank_label(running)}'s training thread and "
                     "cannot be interrupted safely there; `probe actions` shows when it ends")
    if other:
        parts.append(f"{rank_label(other)} did not confirm the cancel: {action_id} may still "
                     f"run there; `probe actions cancel {action_id}` retries it")
    return "; ".join(parts)


def _cancel(session: Session, targets: list[RankTarget], action_id: str) -> list[RankResult]:
    return _send(session, targets, ProbeClient.cancel_action, action_id)


def _finish(r: RankResult, target: int | None) -> RankResult:
    """A rank's final answer as a RankResult: ok only if its action ran and succeeded."""
    raw = _raw(r)
    action = _body(r).action
    if action is None:
        return r if not r.ok else _as_failed(r, "no action state came back")
    # What the CLI keeps per rank (wire.FinishedAction): the action, its rank and the step the
    # rank was at; --json prints it as is.
    data = {"ok": action.get("state") == "ok", "rank": raw.get("rank", r.rank),
            "current_step": raw.get("step"), **action}
    if action.get("state") == "ok":
        return RankResult(r.rank, r.url, True, data, None, r.host, r.pid)
    why = _why(action, raw.get("step"), target)
    err = StepActionError(f"rank {r.rank}: {why}", url=r.url, reason=why)
    return RankResult(r.rank, r.url, False, data, err, r.host, r.pid)


def _why(action: dict[str, Any], current: Any, target: int | None) -> str:
    state = action.get("state")
    never_arrived = action.get("started_at") is None and action.get("waited_ms") is None
    if state == "cancelled" and never_arrived:
        return f"never reached step {target} (at step {current}); cancelled"
    if state in ("cancelled", "skipped"):
        return str(action.get("error") or state)
    if state == "error":
        return str(action.get("error") or "raised")
    if state == "running":
        over = ", past PROBE_ACTION_TIMEOUT_S" if action.get("overran") else ""
        return (f"still running on the training thread{over}; it cannot be interrupted "
                "safely, check again with `probe actions`")
    return f"{state} at step {current}"


def _as_failed(r: RankResult, why: str) -> RankResult:
    err = StepActionError(f"rank {r.rank}: {why}", url=r.url, reason=why)
    return RankResult(r.rank, r.url, False, r.data, err, r.host, r.pid)


def _skipped(targets: list[RankTarget], why: str) -> list[RankResult]:
    return [RankResult(t.rank, t.endpoint.label, False, None,
                       StepActionError(f"rank {t.rank}: {why}", url=t.endpoint.label, reason=why))
            for t in targets]
