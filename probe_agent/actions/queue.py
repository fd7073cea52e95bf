"""ActionQueue: code and built-in actions run on the training thread at a step boundary.

Model
-----
- An action is queued for step N on every targeted rank (the CLI sends the same id to each). It
  runs on the training thread right after optimizer step N, from the step clock's subscriber
  (clock.py), in submission order with the other actions due then. Queries, evals and
  backtraces keep working meanwhile (they run on agent threads).
- Before running, the ranks agree through the job's store that every one of them reached step
  N (agreement.py): an action runs on all of them or on none, so collectives inside it match
  and a rank that never gets there cannot leave the others blocked in one.
- Kinds: one module each under kinds/ (``KINDS``): ``step-eval`` (operator code; the repr of
  a trailing expression comes back), ``lr``, ``checkpoint``, ``profile`` and ``pause``, which
  holds the training thread after step N until ``resume()``. While held, actions queued for
  step N still run there.
- Refused at once (HTTP 400): an LR change or a checkpoint path that the action itself
  would refuse (lr.py, checkpoint_target.py); 409 for a checkpoint path that exists without
  overwrite.
- Refused at once (HTTP 409): no torch, no optimizer step seen yet (nothing to ride on), a step
  this rank has already passed (``reason: "past"``, with ``current_step``), an id already used
  for another request. The id is the client's idempotency key: a submission that repeats an
  earlier one (same id, kind, step, code and arguments) gets that action back, whatever its
  state, and nothing is queued twice.
- Failures: an exception in the code is reported (``state: error`` with the traceback) and
  training goes on. An action still running after PROBE_ACTION_TIMEOUT_S is reported as
  ``overran`` and logged; it is *not* interrupted: stopping code mid-way on the training thread
  could leave the model or optimizer half-updated, or raise into the training loop and end the
  job. Only a queued (or still agreeing) action can be cancelled.
- Every change of state is audited in ``python.audit`` (kind, action_id, at_step, requested_by).
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConflictError
from ..jobs import Job, JobState, JobTable
from ..operator_code import compile_code, user_traceback
from .agreement import StepAgreement
from .kinds import KINDS

if TYPE_CHECKING:
    from ..clock import StepClock
    from ..evaluator import Evaluator
    from ..profiling.sessions import Profiling

log = logging.getLogger(__name__)

#: Finished actions kept for `probe actions` (queued ones are always kept).
KEEP_FINISHED = 200
_ticket = itertools.count()


@dataclass(kw_only=True)
class Action(Job):
    """A step-boundary action: a job (jobs.py) whose states are queued -> waiting (agreeing
    with the other ranks) -> running -> ok | error, or cancelled | skipped."""

    step: int
    code: str
    args: dict[str, Any]
    client: str
    requested_by: str | None
    group: list[int] | None
    waited_ms: float | None = None
    elapsed_ms: float | None = None
    data: Any = None
    stdout: str = ""
    stderr: str = ""
    traceback: str | None = None
    overran: bool = False
    cancel_requested: bool = False
    _order: int = field(default_factory=lambda: next(_ticket))
    #: What the submission asked for (``request_key``), to recognise a retry of it.
    _request: tuple[Any, ...] = ()


def request_key(kind: str, step: int | None, code: str, args: dict[str, Any]) -> tuple[Any, ...]:
    """A submission as it arrived (the checks fill defaults into ``args`` afterwards)."""
    return (kind, step, code, repr(sorted(args.items())))


class ActionQueue:
    """Per-rank queue of step-boundary actions. See the module docstring.

    Args:
        clock: the step clock whose subscriber runs the due actions on the training thread.
        evaluator: its session and output cap: names step-evals and ``/v1/eval`` share.
        rank: named in refusals and logs.
        timeout_s: PROBE_ACTION_TIMEOUT_S: longer is reported as an overrun (never stopped).
        audit: writes one ``python.audit`` row (``Agent.audit``).
        running: whether the agent still runs; a held (paused) training thread is released
            once it does not.
        profiling: the agent's profile windows: a ``profile`` action starts one there.
    """

    def __init__(self, clock: StepClock, evaluator: Evaluator, *, rank: int, timeout_s: float,
                 audit: Callable[..., None], running: Callable[[], bool],
                 profiling: Profiling) -> None:
        self.rank = rank
        self.profiling = profiling
        self.evaluator = evaluator
        self.clock = clock
        self.timeout_s = timeout_s
        self._audit_row = audit
        self._running = running
        self.agreement = StepAgreement()
        #: The job's AMP GradScaler or None (the loop monitor's; set by the agent): a checkpoint
        #: saves its scale, else a resumed fp16 run starts again from 65536 and skips steps.
        self.scaler: Callable[[], Any] = lambda: None
        #: The numerics recorder or None (set by the agent): a ``guard`` action arms it.
        self.numerics: Callable[[], Any] = lambda: None
        self._cond = threading.Condition()
        self._pending: list[Action] = []
        self._jobs: JobTable[Action] = JobTable("action", rank, KEEP_FINISHED,
                                                "`probe actions`")
        self.paused_at: int | None = None
        self._hold = False
        self._holding = False
        self._unsubscribe: Any = None

    def start(self) -> None:
        self._unsubscribe = self.clock.subscribe(self.on_step, "step-boundary actions")

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        with self._cond:  # never leave the training thread held by a stopped agent
            self._hold = False
            for a in self._jobs:
                if a.state == JobState.WAITING:
                    a.cancel_requested = True  # its agreement votes abort at once
            for a in self._pending:
                a.state, a.error = JobState.CANCELLED, "the probe agent stopped"
            self._pending.clear()
            self._cond.notify_all()

    # -- requests (agent threads) -------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        self.clock.poll()
        return {**self.clock.state(), "paused_at": self.paused_at,
                "pending": len(self._pending), "action_timeout_s": self.timeout_s}

    def submit(self, *, kind: str, step: int | None, code: str, args: dict[str, Any],
               client: str, requested_by: str | None, action_id: str,
               group: list[int] | None) -> Action:
        rank = self.rank
        request = request_key(kind, step, code, args)
        with self._cond:
            again = self._jobs.find(action_id)
        if again is not None and again._request == request:
            # A retry of a request whose answer was lost (a 504 while this rank's GIL was held,
            # a dropped connection): the id is the client's idempotency key, so the retry gets
            # the action the first request queued and nothing runs twice.
            return again
        try:
            if kind == "step-eval":
                compile_code(code)  # a SyntaxError is a 400 now, not later
            self._refuse_unless_ready()
            self._check_args(kind, args)
            with self._cond:
                cur = self.clock.current_step
                held = self.paused_at == cur
                target = step if step is not None else (cur if held else cur + 1)
                if target < cur or (target == cur and not held):
                    raise ConflictError(
                        f"rank {rank} is already at step {cur}, past step {target}; nothing was "
                        "queued (use --next-step, or a later --at-step)",
                        reason="past", current_step=cur,
                    )
                twin = self._jobs.find(action_id)
                if twin is not None and twin._request == request:
                    return twin  # the same request, sent twice at once (a retry racing the
                    # first, both released when the GIL came back): one action, no 409
                if action_id in self._jobs:
                    raise ConflictError(f"an action with id {action_id} already exists on rank "
                                        f"{rank} with another request; choose a new id",
                                        reason="duplicate", current_step=cur)
                a = self._jobs.add(Action(
                    id=action_id, kind=kind, step=target, code=code, args=args, client=client,
                    requested_by=requested_by, group=group, _request=request))
                self._pending.append(a)
                self._pending.sort(key=lambda x: (x.step, x._order))
                self._cond.notify_all()
        except Exception as e:
            msg = getattr(e, "message", str(e))
            self._audit_raw(kind, action_id, step, code, client, requested_by, "refused", msg)
            raise
        self._audit(a, "queued")
        return a

    def _refuse_unless_ready(self) -> None:
        rank = self.rank
        if "torch" not in sys.modules:
            raise ConflictError(
                f"torch is not imported on rank {rank}: step-boundary actions ride on torch's "
                "optimizer step hook and there is none here; use plain `probe eval`",
                reason="no-step-hook",
            )
        if not self.clock.poll() or not self.clock.seen_step:
            since = self.clock.armed_at
            ago = f" (step hook armed {time.time() - since:.0f} s ago)" if since else ""
            raise ConflictError(
                f"no optimizer step seen on rank {rank} yet{ago}: either training has not "
                "reached its first optimizer.step() (retry then), or its optimizer is not a "
                "torch.optim.Optimizer and never fires the step hook, so step-boundary actions "
                "cannot run here; use plain `probe eval`",
                reason="no-step-hook",
            )

    def _check_args(self, kind: str, args: dict[str, Any]) -> None:
        """Refuse now (4xx) what the action would refuse at the step boundary: the
        API is reachable without the CLI. The kind's ``run`` checks again there."""
        KINDS[kind].check(self, args)

    @property
    def jobs(self) -> JobTable[Action]:
        """The actions as a job table: ``get`` (404 when unknown), ``wait``, iteration."""
        return self._jobs

    def get(self, action_id: str) -> Action:
        return self._jobs.get(action_id)

    def actions(self) -> list[Action]:
        return list(self._jobs)

    def cancel(self, action_id: str, client: str, requested_by: str | None) -> Action:
        with self._cond:
            a = self.get(action_id)
            if a.state == JobState.RUNNING:
                raise ConflictError(
                    f"action {a.id} is running on rank {self.rank}'s training thread and "
                    "cannot be cancelled: stopping code mid-way there could leave the model "
                    "half-updated or end the job", reason="running",
                    current_step=self.clock.current_step,
                )
            if a.state == JobState.QUEUED:
                self._pending.remove(a)
                a.state, a.finished_at = JobState.CANCELLED, time.time()
                a.error = f"cancelled before step {a.step} (rank was at {self.clock.current_step})"
            elif a.state == JobState.WAITING:
                a.cancel_requested = True  # the agreement votes abort on every rank
            self._cond.notify_all()
        if a.state == JobState.CANCELLED:
            self._audit(a, "cancelled", client=client, requested_by=requested_by)
        return a

    def resume(self, client: str, requested_by: str | None) -> dict[str, Any]:
        """Release a held training thread now, and cancel pauses that have not happened yet."""
        cancelled = []
        with self._cond:
            was = self.paused_at
            for a in [a for a in self._pending if a.kind == "pause"]:
                self._pending.remove(a)
                a.state, a.finished_at = JobState.CANCELLED, time.time()
                a.error = "cancelled by resume before it was reached"
                cancelled.append(a)
            for a in self._jobs:
                if a.kind == "pause" and a.state == JobState.WAITING:
                    a.cancel_requested = True
            self._hold = False
            self._cond.notify_all()
        for a in cancelled:
            self._audit(a, "cancelled", client=client, requested_by=requested_by)
        note = f"released at step {was}" if was is not None else "was not paused"
        self._audit_raw("resume", None, was, "resume", client, requested_by, "ok", None)
        return {"was_paused_at": was, "cancelled": [a.id for a in cancelled], "note": note,
                "step": self.clock.current_step}

    # -- the training thread ------------------------------------------------------------------
    def on_step(self, step: int, optimizer: Any) -> None:
        pending = self._pending
        if not pending or pending[0].step > step:
            return  # the common case: one list read per step
        self._run_due(step)

    def _run_due(self, step: int) -> None:
        while True:
            with self._cond:
                if not self._pending or self._pending[0].step > step:
                    return
                a = self._pending.pop(0)
            if a.step < step:  # cannot happen while submit() checks under the lock; be loud
                a.state, a.error = JobState.SKIPPED, f"step {a.step} passed before it could run"
                a.finished_at = time.time()
                self._audit(a, "skipped")
                continue
            self._run(a, step)
            if a.state == JobState.OK and self._hold and not self._holding:
                self._hold_loop(step)  # a pause (kinds/pause.py) asked to hold here

    def hold_at(self, step: int) -> None:
        """The pause action: hold the training thread after ``step`` until ``resume()``."""
        with self._cond:
            self._hold, self.paused_at = True, step

    def _hold_loop(self, step: int) -> None:
        log.warning("probe agent: rank %d paused after step %d; `probe resume` releases it",
                    self.rank, step)
        self._holding = True
        try:
            while True:
                with self._cond:
                    while (self._hold and self._running()
                           and not (self._pending and self._pending[0].step <= step)):
                        self._cond.wait(1.0)
                    if not self._hold or not self._running():
                        return
                self._run_due(step)
        finally:
            with self._cond:
                self._holding, self._hold, self.paused_at = False, False, None
            log.warning("probe agent: rank %d resumed after step %d", self.rank, step)

    def _run(self, a: Action, step: int) -> None:
        a.state = JobState.WAITING
        t0 = time.perf_counter()
        run, why = self.agreement.agree(a.id, a.group, self.timeout_s,
                                        lambda: a.cancel_requested, step)
        a.waited_ms = round((time.perf_counter() - t0) * 1e3, 3)
        if not run:
            a.state = JobState.CANCELLED if a.cancel_requested else JobState.SKIPPED
            a.error, a.finished_at = why, time.time()
            self._audit(a, a.state)
            return
        a.state, a.started_at = JobState.RUNNING, time.time()
        timer = threading.Timer(self.timeout_s, self._overrun, (a,))
        timer.daemon = True
        timer.name = "probe-agent.action-timer"
        timer.start()
        t1 = time.perf_counter()
        try:
            KINDS[a.kind].run(self, a, step)
            a.state = JobState.OK
        except KeyboardInterrupt:  # a real Ctrl-C is the operator's, not the action's
            a.state, a.error = JobState.ERROR, "KeyboardInterrupt"
            raise
        except BaseException as e:  # operator code may raise anything (SystemExit too)
            a.state, a.error = JobState.ERROR, f"{type(e).__name__}: {e}"
            a.traceback = user_traceback(e)
        finally:
            timer.cancel()
            a.elapsed_ms = round((time.perf_counter() - t1) * 1e3, 3)
            a.finished_at = time.time()
            if a.overran and a.state == JobState.OK:
                a.error = f"overran PROBE_ACTION_TIMEOUT_S={self.timeout_s:g} s"
            self._audit(a, a.state)

    def _overrun(self, a: Action) -> None:
        a.overran = True
        log.warning(
            "probe agent: action %s (%s) has held rank %d's training thread for more than "
            "PROBE_ACTION_TIMEOUT_S=%g s; it cannot be stopped safely from outside (that could "
            "leave the model half-updated or end the job), so training waits until it returns",
            a.id, a.kind, self.rank, self.timeout_s,
        )
        self._audit(a, "overrun")

    # -- audit --------------------------------------------------------------------------------
    def _audit(self, a: Action, outcome: str, client: str | None = None,
               requested_by: str | None = None) -> None:
        self._audit_raw(a.kind, a.id, a.step, a.code, client or a.client,
                        requested_by or a.requested_by, str(outcome), a.error,
                        a.elapsed_ms or 0.0)

    def _audit_raw(self, kind: str, action_id: str | None, step: int | None, code: str,
                   client: str, requested_by: str | None, outcome: str, error: str | None,
                   ms: float = 0.0) -> None:
        try:
            self._audit_row(client, code, outcome, error, ms, kind=kind, action_id=action_id,
                             at_step=step, requested_by=requested_by)
        except Exception as e:  # the audit table must never fail an action or the training
            log.warning("probe agent: could not audit action %s: %s", action_id, e)
