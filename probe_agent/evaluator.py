"""Evaluator: run Python sent by an operator inside the live training process.

Names, output, write-through and tracebacks follow operator_code.py, the rules step-boundary
``step-eval`` actions share: so that ``model``/``optimizer``/``trainer`` work whether the script
keeps them at module level or inside ``def main()``, the names are the main thread's (its
frames' locals, innermost first, and ``__main__`` globals) over those earlier evals defined. The
eval gets its own ``print``; writes made with ``sys.stdout.write`` go to the process's real
stdout. The result is the repr of a trailing expression, if any.

Each eval runs on its own named daemon thread. If it outlives PROBE_EVAL_TIMEOUT_S it is sent an
asynchronous ``EvalTimeout`` (``PyThreadState_SetAsyncExc``), which stops pure-Python loops; code
blocked inside a C call stops once that call returns.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from . import eval_guard
from .operator_code import CodeRun, compile_code, script_namespace, user_traceback


class EvalTimeout(BaseException):
    """Raised asynchronously inside an eval thread that ran past its limit."""


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


class Evaluator:
    """Runs eval requests one at a time, each in a fresh ``probe-agent.eval`` thread.

    Args:
        timeout_s: how long an eval may run before it is interrupted and reported as a timeout.
        output_cap: characters of stdout and of stderr kept per eval.
        playbook: resolves the playbook names (``optimizer``, ``model``...) the code reads and
            the script does not define (operator_code.CodeRun.execute); none: they stay
            undefined.
    """

    def __init__(self, timeout_s: float, output_cap: int,
                 playbook: Callable[[list[str]], dict[str, Any]] | None = None) -> None:
        self.playbook = playbook
        self.timeout_s = timeout_s
        self.output_cap = output_cap
        self.session: dict[str, Any] = {}
        self._lock = threading.Lock()

    def run(self, code: str, extra: dict[str, Any] | None = None) -> EvalOutcome:
        compiled = compile_code(code)
        eval_guard.install()  # cheap and idempotent; FSDP2 may have been imported since
        with self._lock:  # evals are serialised: two at once would race on the namespace
            return self._run_thread(compiled, extra or {})

    def _run_thread(self, compiled: tuple[Any, Any], extra: dict[str, Any]) -> EvalOutcome:
        run = CodeRun(self.output_cap)
        box: dict[str, Any] = {}
        main_thread = threading.main_thread().ident or -1

        def target() -> None:
            try:
                run.execute(compiled, session=self.session, extra=extra,
                            namespace=script_namespace(sys._current_frames().get(main_thread)),
                            playbook=self.playbook)
                box["ok"] = True
            except EvalTimeout:
                box["timeout"] = True
            except BaseException as e:  # the operator's code may raise anything, SystemExit too
                box["error"] = f"{type(e).__name__}: {e}"
                box["traceback"] = user_traceback(e)

        t0 = time.perf_counter()
        th = threading.Thread(target=target, name=eval_guard.EVAL_THREAD, daemon=True)
        th.start()
        th.join(self.timeout_s)
        if th.is_alive():
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(th.ident or 0), ctypes.py_object(EvalTimeout)
            )
            th.join(1.0)
            box["timeout"] = True
        elapsed = (time.perf_counter() - t0) * 1e3
        if box.get("timeout"):
            still = (" (still blocked in a C call; it stops when that call returns)"
                     if th.is_alive() else "")
            return EvalOutcome(
                False, None, run.stdout, run.stderr,
                f"EvalTimeout: eval ran past {self.timeout_s:g} s (PROBE_EVAL_TIMEOUT_S) and was "
                f"interrupted{still}",
                None, elapsed, timed_out=True,
            )
        if box.get("ok"):
            return EvalOutcome(True, run.result, run.stdout, run.stderr, None, None, elapsed)
        return EvalOutcome(
            False, None, run.stdout, run.stderr, box.get("error"), box.get("traceback"), elapsed
        )
