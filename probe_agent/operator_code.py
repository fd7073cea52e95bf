"""Running an operator's Python inside the training process: the one set of rules that
``/v1/eval`` (evaluator.py, on an agent thread) and step-boundary ``step-eval`` actions
(actions/runners.py, on the training thread) share, so the same code behaves the same in both.

- Compile: ``<probe eval>`` is the filename; a trailing expression is split off so that its
  repr comes back. A syntax error is an ``EvalError`` (HTTP 400) before anything runs.
- Names: the training script's, as ``script_namespace`` finds them from a frame (frame locals,
  innermost wins, then ``__main__`` globals; torch's and this agent's own frames are skipped),
  over the names earlier evals defined (``session``), under the caller's extras
  (``probe_step``...).
- Output: the code gets its own ``print`` that writes to a capped per-run buffer. We never swap
  ``sys.stdout`` (contextlib.redirect_stdout is process-global, python/cpython#63602, and would
  capture the training thread's prints).
- Afterwards: rebinding a ``__main__`` global writes through (``LR = 1e-4`` reaches a script that
  reads LR every step); other new names persist in ``session`` for later evals.
- Tracebacks start at the operator's code (``<probe eval>``), without the agent's frames.

Stdlib only; it imports neither torch nor the agent's heavy modules.
"""

from __future__ import annotations

import ast
import builtins
import io
import os
import sys
import traceback
from types import FrameType
from typing import Any

from .errors import EvalError

FILENAME = "<probe eval>"
_AGENT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


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


def compile_code(code: str) -> tuple[Any, Any]:
    """``(body, tail)``: the statements, and the trailing expression (or None) to repr."""
    try:
        tree = ast.parse(code, FILENAME, "exec")
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
    body = compile(tree, FILENAME, "exec")
    return body, compile(tail, FILENAME, "eval") if tail is not None else None


def is_torch_file(filename: str) -> bool:
    """Frames in torch's own package (optimizer wrappers, hooks) are not the training script."""
    return f"{os.sep}torch{os.sep}" in filename


def script_namespace(innermost: FrameType | None) -> dict[str, Any]:
    """Names the training script sees at ``innermost``: the locals of its frames (innermost
    wins), overlaid by ``__main__`` globals. Module-level frames, torch's frames and this
    agent's own frames are skipped: their locals (``self`` inside a forward) are not the
    script's."""
    ns: dict[str, Any] = {}
    chain = []
    frame = innermost
    while frame is not None:
        chain.append(frame)
        frame = frame.f_back
    for f in reversed(chain):  # outermost first, so inner frames overwrite
        name = f.f_code.co_filename
        if f.f_code.co_name == "<module>" or is_torch_file(name) or name.startswith(_AGENT_DIR):
            continue
        ns.update(f.f_locals)
    main = sys.modules.get("__main__")
    if main is not None:
        ns.update(vars(main))
    return ns


def user_traceback(e: BaseException) -> str:
    """From the operator's code (``<probe eval>``) down; the whole chain when none of it is
    the operator's (a built-in action that raised inside the agent)."""
    tb = first = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != FILENAME:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb or first))


class CodeRun:
    """One run of operator code. ``stdout``/``stderr`` hold what it printed even when it
    raised; ``result`` is the repr of its trailing expression (None without one).

    Args:
        output_cap: characters of stdout, of stderr and of the result kept.
    """

    def __init__(self, output_cap: int) -> None:
        self.output_cap = output_cap
        self.result: str | None = None
        self._out, self._err = CappedBuffer(output_cap), CappedBuffer(output_cap)

    @property
    def stdout(self) -> str:
        return self._out.text()

    @property
    def stderr(self) -> str:
        return self._err.text()

    def _print(self, *args: Any, file: Any = None, **kw: Any) -> None:
        target = (self._err if file is sys.stderr
                  else self._out if file in (None, sys.stdout) else file)
        builtins.print(*args, file=target, **kw)

    def execute(self, compiled: tuple[Any, Any], *, session: dict[str, Any],
                namespace: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        """Run ``compiled`` (from ``compile_code``); the code's exceptions propagate.

        Args:
            session: names earlier evals defined; new names the code binds land here.
            namespace: the script's names (``script_namespace``); they override ``session``.
            extra: names for this run only (``probe_step``); never written back.
        """
        body, tail = compiled
        reserved = {"print", "__builtins__", *(extra or {})}
        g = dict(session)
        g.update(namespace)
        g.update(extra or {})
        g["print"] = self._print
        g.setdefault("__builtins__", builtins)
        before = {k: id(v) for k, v in g.items()}
        main_globals = vars(sys.modules["__main__"]) if "__main__" in sys.modules else {}
        try:
            exec(body, g)
            value = eval(tail, g) if tail is not None else None
            self.result = None if value is None else full_repr(value, self.output_cap)
        finally:
            for k, v in g.items():
                if k in reserved or before.get(k) == id(v):
                    continue
                (main_globals if k in main_globals else session)[k] = v
