"""Evaluator: run Python sent by an operator inside the live training process.

Name resolution, so that ``model``/``optimizer``/``trainer`` work whether the script keeps them
at module level or inside ``def main()``: ``__main__`` globals first, then the locals of the main
thread's frames, innermost first, then names this agent's earlier evals defined.

Output: the eval gets its own ``print`` that writes to a per-eval buffer. We never swap
``sys.stdout`` (contextlib.redirect_stdout is process-global, python/cpython#63602, and would
capture the training thread's prints). Writes made with ``sys.stdout.write`` go to the process's
real stdout. The result is the repr of a trailing expression, if any.

Each eval runs on its own named daemon thread. If it outlives PROBE_EVAL_TIMEOUT_S it is sent an
asynchronous ``EvalTimeout`` (``PyThreadState_SetAsyncExc``), which stops pure-Python loops; code
blocked inside a C call stops once that call returns.
"""

from __future__ import annotations

import ast
import builtins
import ctypes
import io
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from .errors import EvalError


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


class CappedBuffer(io.StringIO):
    """A text buffer that keeps at most ``cap`` characters and counts what it dropped."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap
        self.dropped = 0

    def write(self, s: str) -> int:
        room = self.cap - self.tell()
        if room > 0:
            super().write(s[:room])
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def text(self) -> str:
        out = self.getvalue()
        if self.dropped:
            out += (f"\n[probe: output cut, {self.dropped} more characters "
                    "(PROBE_EVAL_OUTPUT_BYTES)]")
        return out


def full_repr(value: Any, cap: int) -> str:
    """The repr an operator asked for (not abbreviated), cut at ``cap`` characters."""
    try:
        text = repr(value)
    except Exception as e:  # a broken __repr__ must not turn a successful eval into an error
        text = f"<repr failed: {type(e).__name__}: {e}>"
    return text if len(text) <= cap else text[:cap] + f"... [{len(text) - cap} more characters]"


def user_traceback(e: BaseException) -> str:
    """The traceback from the operator's code down, without the evaluator's own frames."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def main_thread_namespace() -> dict[str, Any]:
    """Names visible to an eval: frame locals (innermost wins), overlaid by ``__main__`` globals."""
    ns: dict[str, Any] = {}
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    chain = []
    while frame is not None:
        chain.append(frame)
        frame = frame.f_back
    for f in reversed(chain):  # outermost first, so inner frames overwrite
        if f.f_code.co_name != "<module>":
            ns.update(f.f_locals)
    main = sys.modules.get("__main__")
    if main is not None:
        ns.update(vars(main))
    return ns


class Evaluator:
    """Runs eval requests one at a time, each in a fresh ``probe-agent.eval`` thread.

    Args:
        timeout_s: how long an eval may run before it is interrupted and reported as a timeout.
        output_cap: characters of stdout and of stderr kept per eval.
    """

    def __init__(self, timeout_s: float, output_cap: int) -> None:
        self.timeout_s = timeout_s
        self.output_cap = output_cap
        self.session: dict[str, Any] = {}
        self._lock = threading.Lock()

    def compile(self, code: str) -> tuple[Any, Any]:
        try:
            tree = ast.parse(code, "<probe eval>", "exec")
        except SyntaxError as e:
            raise EvalError(
                f"SyntaxError: {e.msg} (line {e.lineno}); check quoting and real newlines",
                traceback="".join(traceback.format_exception_only(SyntaxError, e)),
            ) from None
        except (ValueError, RecursionError, MemoryError, SystemError) as e:
            # Null bytes (ValueError) or absurd nesting: CPython 3.11's parser can raise
            # RecursionError or even SystemError ("AST constructor recursion depth mismatch").
            raise EvalError(f"cannot compile this code: {type(e).__name__}: {e}") from None
        tail = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            tail = ast.Expression(tree.body.pop().value)
        body = compile(tree, "<probe eval>", "exec")
        return body, compile(tail, "<probe eval>", "eval") if tail is not None else None

    def run(self, code: str, extra: dict[str, Any] | None = None) -> EvalOutcome:
        body, tail = self.compile(code)
        with self._lock:  # evals are serialised: two at once would race on the namespace
            return self._run_thread(body, tail, extra or {})

    def _run_thread(self, body: Any, tail: Any, extra: dict[str, Any]) -> EvalOutcome:
        out, err = CappedBuffer(self.output_cap), CappedBuffer(self.output_cap)
        box: dict[str, Any] = {}

        def eval_print(*args: Any, file: Any = None, **kw: Any) -> None:
            target = err if file is sys.stderr else out if file in (None, sys.stdout) else file
            builtins.print(*args, file=target, **kw)

        def target() -> None:
            g = dict(self.session)
            g.update(main_thread_namespace())
            g.update(extra)
            g["print"] = eval_print
            g.setdefault("__builtins__", builtins)
            before = {k: id(v) for k, v in g.items()}
            main_globals = vars(sys.modules["__main__"]) if "__main__" in sys.modules else {}
            try:
                exec(body, g)
                box["result"] = eval(tail, g) if tail is not None else None
                box["ok"] = True
            except EvalTimeout:
                box["timeout"] = True
            except BaseException as e:  # the operator's code may raise anything, SystemExit too
                box["error"] = f"{type(e).__name__}: {e}"
                box["traceback"] = user_traceback(e)
            finally:
                for k, v in g.items():
                    if k in ("print", "__builtins__") or before.get(k) == id(v):
                        continue
                    # Rebinding a __main__ global writes through, so `LR = 1e-4` reaches a script
                    # that reads LR every step; other new names persist for later evals.
                    if k in main_globals:
                        main_globals[k] = v
                    else:
                        self.session[k] = v

        t0 = time.perf_counter()
        th = threading.Thread(target=target, name="probe-agent.eval", daemon=True)
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
                False, None, out.text(), err.text(),
                f"EvalTimeout: eval ran past {self.timeout_s:g} s (PROBE_EVAL_TIMEOUT_S) and was "
                f"interrupted{still}",
                None, elapsed, timed_out=True,
            )
        if box.get("ok"):
            result = box.get("result")
            rtext = None if result is None else full_repr(result, self.output_cap)
            return EvalOutcome(True, rtext, out.text(), err.text(), None, None, elapsed)
        return EvalOutcome(
            False, None, out.text(), err.text(), box.get("error"), box.get("traceback"), elapsed
        )
