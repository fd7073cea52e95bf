"""Running an operator's Python inside the training process: the one set of rules that
``/v1/eval`` (evaluator.py, on an agent thread) and step-boundary ``step-eval`` actions
(actions/kinds/step_eval.py, on the training thread) share, so the same code behaves the same
in both.

- Compile: ``<probe eval>`` is the filename; a trailing expression is split off so that its
  repr comes back. A syntax error is an ``EvalError`` (HTTP 400) before anything runs.
- Names: the training script's, as ``script_namespace`` finds them from a frame (frame locals,
  innermost wins, then ``__main__`` globals; torch's and this agent's own frames are skipped),
  over the names earlier evals defined (``session``), under the caller's extras
  (``probe_step``...).
- Playbook names: ``optimizer``, ``model``, ``scheduler``/``lr_scheduler``,
  ``train_loader`` and ``trainer``, when the code uses one that the script does not define
  itself (in its own files' frames or ``__main__``) nor an earlier eval, are the objects the
  framework layer discovers (probe_agent/frameworks: ``trainer.optimizer`` under the HF
  Trainer, unwrapped to the optimizer that steps). A framework's own frame locals (``model`` in
  ``Trainer.training_step``) do not count as the script's, nor does a module bound to the name
  (``from torch.optim import lr_scheduler``). Two candidates for one name are a
  ``NameError`` that lists them; an unused name is never looked up.
- Output: the code gets its own ``print`` that writes to a capped per-run buffer. We never swap
  ``sys.stdout`` (contextlib.redirect_stdout is process-global, python/cpython#63602, and would
  capture the training thread's prints).
- Rebinding a ``__main__`` global writes through at once (``LR = 1e-4`` reaches a script that
  reads LR every step) when the new value is the same kind as the old (``_same_kind``); a
  rebinding to another kind (the model ``m`` to a ctypes struct) is dropped and the eval's
  stderr says so. Other new names persist in ``session`` for later evals.
- Tracebacks start at the operator's code (``<probe eval>``), without the agent's frames.

Stdlib only; it imports neither torch nor the agent's heavy modules.
"""

from __future__ import annotations

import ast
import builtins
import io
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any, NamedTuple

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


#: Names the seed playbook uses that the framework layer supplies when the script does not.
PLAYBOOK_NAMES = ("optimizer", "model", "scheduler", "lr_scheduler", "train_loader", "trainer")
#: Where installed packages and the standard library live: frames there are not the script's.
_LIBRARY_DIRS = tuple(
    os.path.join(os.path.abspath(p), "")
    for p in {sysconfig.get_paths().get(k) for k in ("purelib", "platlib", "stdlib",
                                                        "platstdlib")} if p
)


class Compiled(NamedTuple):
    body: Any
    tail: Any
    #: Every name the code reads (``ast.Name`` in a load context), nested scopes included.
    loads: frozenset[str]


class ScriptNames(dict[str, Any]):
    """The names ``script_namespace`` found; ``own`` are those the script itself defines (its
    files' frames and ``__main__``), not a framework's frame locals."""

    own: set[str]


def compile_code(code: str) -> Compiled:
    """The statements, the trailing expression (or None) to repr, and the names read."""
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
    loads = frozenset(n.id for n in ast.walk(tree)
                      if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))
    tail = None
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr):
        tree.body.pop()
        tail = ast.Expression(last.value)
    body = compile(tree, FILENAME, "exec")
    return Compiled(body, compile(tail, FILENAME, "eval") if tail is not None else None, loads)


def is_torch_file(filename: str) -> bool:
    """Frames in torch's own package (optimizer wrappers, hooks) are not the training script."""
    return f"{os.sep}torch{os.sep}" in filename


def is_library_file(filename: str) -> bool:
    """An installed package's or the standard library's file (a framework's loop), not the
    training script's."""
    return filename.startswith(_LIBRARY_DIRS) or filename.startswith("<frozen")


def script_namespace(innermost: FrameType | None) -> ScriptNames:
    """Names the training script sees at ``innermost``: the locals of its frames (innermost
    wins), overlaid by ``__main__`` globals. Module-level frames, torch's frames and this
    agent's own frames are skipped: their locals (``self`` inside a forward) are not the
    script's. Frames of installed packages (a framework's loop) only add names the script's
    own frames lack; ``own`` marks the names from the script's files and ``__main__``."""
    ns = ScriptNames()
    library: dict[str, Any] = {}
    chain = []
    frame = innermost
    while frame is not None:
        chain.append(frame)
        frame = frame.f_back
    for f in reversed(chain):  # outermost first, so inner frames overwrite
        name = f.f_code.co_filename
        if f.f_code.co_name == "<module>" or is_torch_file(name) or name.startswith(_AGENT_DIR):
            continue
        (library if is_library_file(name) else ns).update(f.f_locals)
    ns.own = set(ns)
    for k, v in library.items():  # a framework's locals never hide the script's own names
        ns.setdefault(k, v)
    main = sys.modules.get("__main__")
    if main is not None:
        ns.update(vars(main))
        ns.own.update(vars(main))
    return ns


def _same_kind(old: Any, new: Any) -> bool:
    """May an eval rebind a script global holding ``old`` to ``new``? The same type, any two
    real numbers (``LR = 1e-4`` over ``LR = 6e-4``, ``max_iters = 100``), or a global that
    was None (set later by the script itself)."""
    if old is None or type(old) is type(new):
        return True
    number = (int, float)
    return isinstance(old, number) and isinstance(new, number)


class _WriteThrough(dict[str, Any]):
    """The eval's top-level names. Each assignment lands in the eval's globals at once (so
    functions and comprehensions the code defines see it) and, for a script global of the same
    kind, in ``__main__`` at once too: ``LR = 1e-4; print(get_lr())`` must see the new LR, and
    a script function reads ``__main__``, not the eval's copy. A dict subclass as ``locals``
    makes CPython call ``__setitem__`` for every top-level store (an exact dict is bypassed)."""

    def __init__(self, g: dict[str, Any], main_globals: dict[str, Any],
                 reserved: set[str]) -> None:
        super().__init__()
        self._g, self._main, self._reserved = g, main_globals, reserved

    def __setitem__(self, k: str, v: Any) -> None:
        super().__setitem__(k, v)
        self._g[k] = v
        if k not in self._reserved and k in self._main and _same_kind(self._main[k], v):
            self._main[k] = v

    def __delitem__(self, k: str) -> None:
        if k not in self and k not in self._g:
            raise KeyError(k)
        self.pop(k, None)
        self._g.pop(k, None)


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

    def execute(self, compiled: Compiled, *, session: dict[str, Any],
                namespace: dict[str, Any], extra: dict[str, Any] | None = None,
                playbook: Callable[[list[str]], dict[str, Any]] | None = None) -> None:
        """Run ``compiled`` (from ``compile_code``); the code's exceptions propagate.

        Args:
            session: names earlier evals defined; new names the code binds land here.
            namespace: the script's names (``script_namespace``); they override ``session``.
            extra: names for this run only (``probe_step``); never written back.
            playbook: resolves the playbook names the code reads and neither the script nor
                ``session`` defines (the agent passes the framework layer's
                ``playbook.resolve``); none: those names stay undefined.
        """
        body, tail, loads = compiled
        reserved = {"print", "__builtins__", *(extra or {})}
        g = dict(session)
        g.update(namespace)
        own = getattr(namespace, "own", set(namespace))
        # A module under a playbook name (`from torch.optim import lr_scheduler`, `import
        # model`) is not what the playbook means by it.
        wanted = [n for n in PLAYBOOK_NAMES
                  if n in loads and n not in session and n not in (extra or {})
                  and (n not in own or isinstance(namespace.get(n), ModuleType))]
        if wanted and playbook is not None:
            g.update(playbook(wanted))
        g.update(extra or {})
        g["print"] = self._print
        g.setdefault("__builtins__", builtins)
        before = {k: id(v) for k, v in g.items()}
        main_globals = vars(sys.modules["__main__"]) if "__main__" in sys.modules else {}
        names = _WriteThrough(g, main_globals, reserved)
        try:
            exec(body, g, names)
            value = eval(tail, g, names) if tail is not None else None
            self.result = None if value is None else full_repr(value, self.output_cap)
        finally:
            for k, v in g.items():
                if k in reserved or before.get(k) == id(v):
                    continue
                if k in main_globals and not _same_kind(main_globals[k], v):
                    # `m = libc.mallinfo2()` replaced a script's DDP model `m` and killed the
                    # job at its next step: a rebinding to another kind of object is dropped,
                    # and the operator is told.
                    self._err.write(
                        f"probe: {k!r} was not written to the script: it holds a "
                        f"{type(main_globals[k]).__name__} and this eval bound a "
                        f"{type(v).__name__}; the job keeps its own (use another name)\n")
                    continue
                (main_globals if k in main_globals else session)[k] = v
