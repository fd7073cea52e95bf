"""Evaluator: run Python sent by an operator inside the live training process.

Names, output, write-through and tracebacks follow operator_code.py, the rules step-boundary
``step-eval`` actions share: so that ``model``/``optimizer``/``trainer`` work whether the script
keeps them at module level or inside ``def main()``, the names are the main thread's (its
frames' locals, innermost first, and ``__main__`` globals) over those earlier evals defined. The
eval gets its own ``print``; writes made with ``sys.stdout.write`` go to the process's real
stdout. The result is the repr of a trailing expression, if any.

Each eval is a job (jobs.py: ``E1``, ``E2``…, or the id the client sent) that runs on its own
named daemon thread under eval_trace.py (no collectives; a cancel that sticks). Past
PROBE_EVAL_TIMEOUT_S, or on ``cancel(id)``, it is cancelled: every further line it runs, in
its own frames and in whatever it called, raises ``EvalCancelled``. Code blocked inside one C
call stops once that call returns. An eval still running when its
request gives up stays in the table (``running``, ``cancel_requested``), with the step time the
job has had since it started against the steps before it (``step_cost``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import eval_guard
from .eval_trace import EvalCancelled, EvalTrace
from .jobs import Job, JobState, JobTable
from .operator_code import CodeRun, compile_code, script_namespace, user_traceback
from .thread_frames import current_frames

#: Finished evals kept for `GET /v1/evals` (running ones are always kept).
KEEP_FINISHED = 50
#: After a cancel, how long the request waits for the eval to stop before answering.
STOP_WAIT_S = 1.0


@dataclass(kw_only=True)
class EvalJob(Job):
    kind: str = "eval"
    code: str = ""
    client: str = ""
    stdout: str = ""
    stderr: str = ""
    traceback: str | None = None
    elapsed_ms: float | None = None
    timed_out: bool = False
    #: Why it was asked to stop (a timeout or an operator's cancel); it may not have yet.
    cancel_requested: str | None = None
    #: The step time of the job while the eval ran, against before (``step_cost``).
    cost: dict[str, Any] = field(default_factory=dict)
    _trace: EvalTrace | None = None
    _thread: threading.Thread | None = None

    @property
    def still_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


@dataclass(slots=True)
class EvalOutcome:
    ok: bool
    result: str | None
    stdout: str
    stderr: str
    error: str | None
    traceback: str | None
    elapsed_ms: float
    timed_out: bool = False
    job: EvalJob | None = None
    #: The answer of an eval that had already run under this id (the same request sent
    #: again): it did not run twice.
    replayed: bool = False


class Evaluator:
    """Runs eval requests one at a time, each in a fresh ``probe-agent.eval`` thread.

    Args:
        timeout_s: how long an eval may run before it is cancelled and reported as a timeout.
        output_cap: characters of stdout and of stderr kept per eval.
        rank: named in errors.
        playbook: resolves the playbook names (``optimizer``, ``model``...) the code reads and
            the script does not define (operator_code.CodeRun.execute); none: they stay
            undefined.
        step_cost: ``(since, until) -> dict``: the job's step time over that span against
            the steps before it (the agent's store); None reports no cost.
    """

    def __init__(self, timeout_s: float, output_cap: int, *, rank: int = 0,
                 playbook: Callable[[list[str]], dict[str, Any]] | None = None,
                 step_cost: Callable[[float, float], dict[str, Any]] | None = None) -> None:
        self.playbook = playbook
        self.timeout_s = timeout_s
        self.output_cap = output_cap
        self.session: dict[str, Any] = {}
        self.jobs: JobTable[EvalJob] = JobTable("eval", rank, KEEP_FINISHED,
                                                "`probe query \"select * from python.evals\"`")
        self._step_cost = step_cost
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def run(self, code: str, client: str = "", extra: dict[str, Any] | None = None,
            eval_id: str | None = None) -> EvalOutcome:
        """Run ``code`` as eval ``eval_id`` (default ``E<n>``). The id is an idempotency key:
        the same code under an id that ran already is answered with that eval's outcome (a
        request retried after the watchdog's 504 while the GIL was held, which the agent then
        got twice), never run twice; other code under a used id is a 409."""
        compiled = compile_code(code)
        eval_guard.install()  # cheap and idempotent; FSDP2 may have been imported since
        earlier = self._same(eval_id, code)
        if earlier is not None:  # not under the lock: the first may still be running
            return self._replay(earlier)
        with self._lock:  # evals are serialised: two at once would race on the namespace
            earlier = self._same(eval_id, code)
            if earlier is not None:
                return self._replay(earlier)
            job = self.jobs.add(EvalJob(id=eval_id or f"E{next(self._ids)}", code=code,
                                        client=client))
            return self._run_thread(job, compiled, extra or {})

    def _same(self, eval_id: str | None, code: str) -> EvalJob | None:
        job = self.jobs.find(eval_id) if eval_id else None
        return job if job is not None and job.code == code else None

    def _replay(self, job: EvalJob) -> EvalOutcome:
        """``job``'s outcome, once it has ended (at most PROBE_EVAL_TIMEOUT_S from now)."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        while not job.finished and time.monotonic() < deadline:
            th = job._thread
            if th is not None:
                th.join(max(0.0, deadline - time.monotonic()))
            else:
                time.sleep(0.01)  # added, its thread not started yet
        elapsed = (time.perf_counter() - t0) * 1e3
        if not job.finished:
            return EvalOutcome(False, None, job.stdout, job.stderr, (
                f"eval {job.id} (this request's id) is already running and still was after "
                f"{self.timeout_s:g} s (PROBE_EVAL_TIMEOUT_S); it was not started again: "
                f"`probe eval --cancel {job.id}` stops it"), None, elapsed, timed_out=True,
                job=job, replayed=True)
        return EvalOutcome(job.state == JobState.OK, job.result, job.stdout, job.stderr,
                           job.error, job.traceback, job.elapsed_ms or elapsed, job=job,
                           timed_out=job.timed_out, replayed=True)

    def _run_thread(self, job: EvalJob, compiled: Any, extra: dict[str, Any]) -> EvalOutcome:
        run = CodeRun(self.output_cap)
        trace = job._trace = EvalTrace()
        main_thread = threading.main_thread().ident or -1
        t0 = time.perf_counter()

        def target() -> None:
            state = JobState.ERROR
            trace.install()
            try:
                run.execute(compiled, session=self.session, extra=extra,
                            namespace=script_namespace(current_frames().get(main_thread)),
                            playbook=self.playbook)
                job.result, state = run.result, JobState.OK
            except EvalCancelled as e:
                job.error, state = f"EvalCancelled: {e}", JobState.CANCELLED
            except BaseException as e:  # the operator's code may raise anything, SystemExit too
                job.error, state = f"{type(e).__name__}: {e}", JobState.ERROR
                job.traceback = user_traceback(e)
            finally:
                trace.active = False  # first, and without a call: a traced call would raise
                trace.remove()
            job.stdout, job.stderr = run.stdout, run.stderr
            job.elapsed_ms = round((time.perf_counter() - t0) * 1e3, 3)
            if job.cancel_requested and job.started_at is not None:
                job.cost = self.cost_of(job)
            job.finish(state)

        th = job._thread = threading.Thread(target=target, name=eval_guard.EVAL_THREAD,
                                            daemon=True)
        job.state, job.started_at = JobState.RUNNING, time.time()
        th.start()
        th.join(self.timeout_s)
        if th.is_alive():
            job.timed_out = True
            self._stop(job, f"ran past {self.timeout_s:g} s (PROBE_EVAL_TIMEOUT_S)")
        elapsed = (time.perf_counter() - t0) * 1e3
        if job.timed_out:
            return EvalOutcome(False, None, run.stdout, run.stderr, self.describe_stop(job),
                               None, elapsed, timed_out=True, job=job)
        ok = job.state == JobState.OK
        return EvalOutcome(ok, job.result, job.stdout, job.stderr, job.error, job.traceback,
                           elapsed, job=job)

    # -- cancel -------------------------------------------------------------------------------
    def cancel(self, eval_id: str, client: str) -> EvalJob:
        """Cancel a running eval (every further line of it raises); a finished one is left as
        it is. Waits up to STOP_WAIT_S for it to stop."""
        job = self.jobs.get(eval_id)
        if not job.finished:
            self._stop(job, f"cancelled by {client or 'an operator'}")
        return job

    def _stop(self, job: EvalJob, why: str) -> None:
        job.cancel_requested = why
        th = job._thread
        if job._trace is not None and th is not None:
            # No PyThreadState_SetAsyncExc: one that lands after the thread's last bytecode
            # leaves CPython 3.11's eval breaker set for good (every later eval thread then
            # crawled), and the line trace stops every frame it would have.
            job._trace.cancel(why, th.ident)
            th.join(STOP_WAIT_S)
        if job.still_running:
            job.cost = self.cost_of(job)

    def cost_of(self, job: EvalJob) -> dict[str, Any]:
        if self._step_cost is None or job.started_at is None:
            return {}
        return self._step_cost(job.started_at, job.finished_at or time.time())

    def describe_stop(self, job: EvalJob) -> str:
        """One line: what a cancel or timeout did to ``job``, true at the time of asking."""
        why = job.cancel_requested or "cancelled"
        if not job.still_running:
            return f"EvalCancelled: eval {job.id} {why} and was stopped"
        from .step_cost import describe_cost

        return (f"EvalCancelled: eval {job.id} {why} and was asked to stop, but is still "
                "running (blocked in a C call, or catching every exception); its cost to "
                f"training so far: {describe_cost(job.cost)}; `probe eval --cancel {job.id}` "
                "asks again")
