"""HostSyncCounter: the training thread's host syncs per step, with their call sites ->
``python.host_syncs``.

What counts
-----------
Every call that makes the host wait for the device, or turns a tensor into a Python value (which
waits for the device on CUDA): ``.item()`` (and ``bool``/``int``/``float`` of a tensor),
``.tolist()``, ``.cpu()``/``.numpy()``/``.to("cpu")``, ``print``/``repr``/format of a tensor,
ops whose output shape depends on the data (``nonzero``, ``torch.where`` with one argument,
``masked_select``, ``unique``, ``bincount``, ``argwhere``), and ``torch.cuda.synchronize``/
``Stream.synchronize``/``Event.synchronize``. On CPU the same calls are counted (on a GPU they
would sync); ``.cpu()`` and ``.numpy()`` of a CPU tensor are counted only while the process has
no CUDA context (on a CUDA job a CPU tensor's ``.numpy()`` waits for nothing). Likewise any call
on a CPU tensor counts only in a process with no CUDA context, and only when the job's own code
makes it: torch keeps some tensors on the CPU on purpose (Adam reads each parameter's step count
with ``.item()``: 28 "syncs" a step at ``optimizer.step()`` on build-nanogpt before this rule),
and those do not sync on a GPU either.

Only the training thread (the one that steps the optimizer) is counted, and only calls that
come from outside torch and the agent: a call made inside torch (``GradScaler.step``'s
``.item()``) is attributed to the first frame outside torch that led to it (the user's
``scaler.step(optimizer)`` line), and one whose first frame outside torch is the agent's (a
hook of the agent reading a value) is not counted; a call nested in a counted one (``format``
calling ``.item()``, ``repr`` walking the tensor) counts once.

Why patching, and on every step
-------------------------------
A ``TorchFunctionMode`` would see every call too, but puts a Python frame in front of every
torch function and tensor method of the step (~1-2 us each, hundreds a step), and torch.compile
refuses to trace under some modes. Replacing only the methods that sync costs nothing on the
ops that do not sync, and about a microsecond on each one that does (bench/bench_levers.py
measures both), so counting runs on every step, traced or not. Inside code that torch.compile
traces the wrappers call the original at once (``torch.compiler.is_compiling()``), so dynamo
sees the plain call: no graph break and no recompile is added (tests/unit/test_host_syncs.py).

``.to()`` is every batch move (``batch.to(device)``, several a step), and only the device-to-host
ones sync, so it is patched apart (``TO_POINT``): only once the process has a CUDA context, never
in a CPU-only job (which then pays nothing for it: a CPU-only job's ``.to("cpu")`` copies nothing
either, so there is nothing to count). Counted: a tensor not on the CPU copied to the CPU
(``.to("cpu")``, ``.to(torch.device("cpu"))``, ``.to(cpu_tensor)``), not with
``non_blocking=True`` (an asynchronous copy, no wait); a batch move to the device returns to
the original after one ``is_cpu`` read (bench/bench_levers.py measures the wrapper per call).

Cost bound: at most ``MAX_SITES`` call sites per step are kept apart; the rest of the step's
calls go into one row with ``file`` NULL, so a loop with thousands of distinct sites still
writes a bounded number of rows.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from .. import patches
from . import Guard, Sink
from .registry import CollectorSpec
from .row_buffer import RowBuffer

if TYPE_CHECKING:
    from ..clock import StepClock

TABLE = "python.host_syncs"
#: Call sites kept apart per step; the rest are summed into one row.
MAX_SITES = 32
#: Steps of rows kept between flushes (a flush every PROBE_FLUSH_MS drains them).
BUFFER = 50_000

#: (where, attribute, kind, rule). ``where``: "Tensor" (torch.Tensor), "torch" (the torch
#: module), or a dotted path under torch. rule: None (always counts), "one_arg" (torch.where
#: with a single argument), "to_host" (.cpu()/.numpy(): a device tensor, or any on a CPU-only
#: process).
POINTS: tuple[tuple[str, str, str, str | None], ...] = (
    ("Tensor", "item", "item", None),
    ("Tensor", "__bool__", "item", None),
    ("Tensor", "__int__", "item", None),
    ("Tensor", "__float__", "item", None),
    ("Tensor", "tolist", "tolist", None),
    ("Tensor", "cpu", "cpu", "to_host"),
    ("Tensor", "numpy", "cpu", "to_host"),
    ("Tensor", "__repr__", "print", None),
    ("Tensor", "__format__", "print", None),
    ("Tensor", "nonzero", "data_shape", None),
    ("Tensor", "masked_select", "data_shape", None),
    ("Tensor", "unique", "data_shape", None),
    ("Tensor", "bincount", "data_shape", None),
    ("torch", "nonzero", "data_shape", None),
    ("torch", "argwhere", "data_shape", None),
    ("torch", "masked_select", "data_shape", None),
    ("torch", "unique", "data_shape", None),
    ("torch", "bincount", "data_shape", None),
    ("torch", "where", "data_shape", "one_arg"),
    ("cuda", "synchronize", "synchronize", None),
    ("cuda.Stream", "synchronize", "synchronize", None),
    ("cuda.Event", "synchronize", "synchronize", None),
)
#: ``Tensor.to``: patched only in a process with a CUDA context (see the module docstring).
TO_POINT = ("Tensor", "to", "cpu", "to_cpu")
#: What each kind is called in a verdict.
KIND_LABEL = {"item": ".item()", "tolist": ".tolist()", "cpu": '.cpu()/.numpy()/.to("cpu")',
              "print": "print/format of a tensor", "data_shape": "data-dependent shape",
              "synchronize": "synchronize"}

# Hot-path state (module globals: the cheapest reads).
_counter: HostSyncCounter | None = None
_get_ident = threading.get_ident
_perf_ns = time.perf_counter_ns
_getframe = sys._getframe
_is_compiling: Any = None
_Tensor: Any = None


def _wrap(kind: str, rule: str | None, original: Any) -> Any:
    """The stand-in for one sync point: counts the call when the counter wants it, and always
    calls ``original`` with the same arguments."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling():  # first: dynamo folds it and traces the plain call
            return original(*args, **kwargs)
        c = _counter
        if c is None or c.inside or _get_ident() != c.thread:
            return original(*args, **kwargs)
        if rule is not None and not _wanted(rule, c, args, kwargs):
            return original(*args, **kwargs)
        caller = _getframe(1)
        if args and isinstance(t := args[0], _Tensor) and t.is_cpu and rule != "to_host" and (
                not c.cpu_only or caller.f_code.co_filename.startswith(c._torch_dir)):
            # A CPU tensor syncs with nothing on a CUDA job; and torch's own code keeps some
            # tensors on the CPU on purpose (Adam's step counts, read with .item() per
            # parameter), which would not sync on a GPU either.
            return original(*args, **kwargs)
        c.inside = True
        key = c.hit(kind, caller)
        t0 = _perf_ns()
        try:
            return original(*args, **kwargs)
        finally:
            c.inside = False
            if key is not None:
                c.wait_ns[key] = c.wait_ns.get(key, 0) + _perf_ns() - t0

    counted.__name__ = getattr(original, "__name__", "counted")
    counted.__qualname__ = getattr(original, "__qualname__", counted.__name__)
    counted.__doc__ = getattr(original, "__doc__", None)
    counted.__wrapped__ = original  # type: ignore[attr-defined]
    # What dynamo traces in its place (it unwraps this attribute, as for its own wrappers), so
    # a compiled frame sees the plain call: the same graphs and breaks as without the agent.
    counted._torchdynamo_inline = original  # type: ignore[attr-defined]
    return counted


def _skip_in_dynamo(torch: Any) -> None:
    """Dynamo never compiles the stand-in's own frame: where the original breaks the graph
    (``.item()``, ``nonzero``), dynamo breaks at the caller's line as it would without the agent,
    and the stand-in then runs eagerly (without this it compiled the stand-in as one more frame
    with one more break). Through torch's C extension only: importing torch._dynamo here would
    cost the job seconds it may never spend. Recursive: the counting it calls is not looked at
    either (dynamo counted it as a frame seen)."""
    ef = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    if ef is None or not hasattr(ef, "set_code_exec_strategy"):
        return
    skip = ef._FrameExecStrategy(ef._FrameAction.SKIP, ef._FrameAction.SKIP)
    code = _wrap("item", None, len).__code__
    ef.set_code_exec_strategy(code, skip)
    if not any(x.name == "torch._dynamo code strategy: host syncs" for x in patches.settings()):
        patches.setting("torch._dynamo code strategy: host syncs",
                        "SKIP (recursive) for the host-sync stand-ins", by="host sync counter",
                        why="dynamo traces the plain call where a stand-in is called, and never "
                            "compiles the stand-in's own frame",
                        restorable=False, why_kept="dynamo has no way to unset a code's "
                        "strategy; it only concerns the agent's own code object")


def _wanted(rule: str, c: HostSyncCounter, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if rule == "one_arg":
        return len(args) + len(kwargs) == 1
    if rule == "to_host":
        t = args[0] if args else None
        return t is not None and (c.cpu_only or getattr(t, "is_cpu", True) is False)
    if rule == "to_cpu":
        return bool(args) and args[0].is_cpu is False and _to_cpu(args, kwargs)
    return True


def _to_cpu(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``Tensor.to(*args[1:], **kwargs)`` targets the CPU and waits for the copy:
    ``to(device, dtype=None, non_blocking=False, copy=False)``, ``to(dtype, non_blocking,
    ...)`` or ``to(other, non_blocking, ...)``."""
    if kwargs.get("non_blocking") or any(a is True for a in args[2:]):
        return False  # an asynchronous copy: no wait (positional non_blocking: a bool True)
    dev = kwargs.get("device")
    if dev is None and len(args) > 1:
        dev = args[1]
        if isinstance(dev, _Tensor):
            return dev.is_cpu
    if isinstance(dev, str):
        return dev == "cpu" or dev.startswith("cpu:")
    return getattr(dev, "type", None) == "cpu"


class HostSyncCounter:
    """Collector for ``python.host_syncs``; see the module docstring.

    Args:
        clock: the step clock: counts are cut at its steps, on the training thread.
        rank: written into every row.
    """

    def __init__(self, clock: StepClock, rank: int) -> None:
        self.clock = clock
        self.rank = rank
        self.guard = Guard("host sync counter")
        self.thread: int | None = None
        self.inside = False
        self.cpu_only = True
        self.counts: dict[tuple[str, Any, int], int] = {}
        self.wait_ns: dict[tuple[str, Any, int], int] = {}  # time inside the calls
        self.rows = RowBuffer(TABLE, BUFFER)  # python.host_syncs rows, flushed by the writer
        self._unsubscribe: Any = None
        self._patched: list[patches.Patch] = []
        self._to_patched = False
        self._where: dict[Any, int] = {}  # code object -> 0 the job's, 1 torch's, 2 the agent's
        self._torch_dir = self._agent_dir = "\0"
        self._steps = 0

    # -- collector protocol ------------------------------------------------------------------
    def start(self, sink: Sink) -> None:
        self.rows.start(sink)
        self._unsubscribe = self.clock.subscribe(self._on_step, "host sync counter")
        sink.add_flusher(self.flush)

    def stop(self) -> None:
        global _counter
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if _counter is self:
            _counter = None
        self.uninstall()
        self.flush()

    # -- patches -----------------------------------------------------------------------------
    def install(self, torch: Any) -> None:
        """Put the counting stand-ins in place (training thread, at the first step), each
        through the patch ledger (`probe info` lists them)."""
        global _counter, _is_compiling, _Tensor
        _is_compiling = torch.compiler.is_compiling
        _Tensor = torch.Tensor
        self._agent_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
        self._torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        for point in POINTS:
            self._patch(torch, point)
        try:
            _skip_in_dynamo(torch)
        except (AttributeError, TypeError, RuntimeError) as e:  # an older or newer torch
            self.guard.failed(e)
        self.thread = _get_ident()
        _counter = self

    def _patch(self, torch: Any, point: tuple[str, str, str, str | None]) -> None:
        where, name, kind, rule = point
        owner = _owner(torch, where)
        if owner is None:
            return
        original = getattr(owner, name, None)
        if original is None or patches.ours(original) is not None:
            return  # absent in this torch, or an earlier agent's stand-in still there
        self._patched.append(patches.replace(
            owner, name, _wrap(kind, rule, original), by="host sync counter",
            why=f"counts {KIND_LABEL[kind]} calls per step with their call sites"))

    def install_to(self, torch: Any) -> None:
        """Count ``.to("cpu")`` of device tensors too (once the process has a CUDA context:
        a CPU-only job never pays for a stand-in in front of its batch moves)."""
        self._to_patched = True
        self._patch(torch, TO_POINT)

    def uninstall(self) -> None:
        """Put every original back, newest first (what was inherited is inherited again)."""
        patched, self._patched = self._patched, []
        for p in reversed(patched):
            patches.restore(p)

    # -- training thread ---------------------------------------------------------------------
    def hit(self, kind: str, frame: Any) -> tuple[str, Any, int] | None:
        """One counted call; ``frame`` is its caller's. Returns the site's key (None: not
        counted: the agent's own call, or only torch on the stack). Never raises."""
        try:
            where = self._where
            while frame is not None:
                code = frame.f_code
                place = where.get(code)
                if place is None:
                    name = code.co_filename
                    place = where[code] = 1 if name.startswith(self._torch_dir) else (
                        2 if name.startswith(self._agent_dir) else 0)
                if place == 0:
                    break
                if place == 2:
                    return None  # the agent's own work (a hook reading a norm): not the job's
                frame = frame.f_back
            if frame is None:
                return None  # only torch's own code on the stack
            key = (kind, frame.f_code, frame.f_lineno)
            self.counts[key] = self.counts.get(key, 0) + 1
            return key
        except Exception as e:  # noqa: BLE001 - training thread: counted, never raised
            self.guard.failed(e)
            return None

    def _on_step(self, step: int, optimizer: Any) -> None:
        global _counter
        torch = sys.modules.get("torch")
        if not self.guard.enabled:
            if _counter is self:
                _counter = None
                self.uninstall()
            return
        if torch is None:
            return
        if _counter is None and not self._patched:
            self.install(torch)  # counting starts with the step after the first seen
            return
        cuda = getattr(torch, "cuda", None)
        self.cpu_only = not (cuda is not None and cuda.is_initialized())
        if not self.cpu_only and not self._to_patched:
            self.install_to(torch)
        counts, self.counts = self.counts, {}
        waits, self.wait_ns = self.wait_ns, {}
        if not counts or self.rows.full():
            return
        now = time.time()
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])
        for key, n in ranked[:MAX_SITES]:
            kind, code, line = key
            self.rows.add((now, self.rank, step, kind, code.co_filename, line, code.co_name,
                           n, waits.get(key, 0) / 1e9))
        rest: dict[str, list[float]] = {}
        for key, n in ranked[MAX_SITES:]:
            acc = rest.setdefault(key[0], [0.0, 0.0])
            acc[0] += n
            acc[1] += waits.get(key, 0) / 1e9
        for kind, (calls, secs) in rest.items():
            self.rows.add((now, self.rank, step, kind, None, None, None, int(calls), secs))

    # -- writer thread -----------------------------------------------------------------------
    def flush(self) -> None:
        self.rows.flush()

    def state(self) -> dict[str, Any]:
        return {"installed": bool(self._patched), "points": len(self._patched),
                "failures": self.guard.failures, "disabled": not self.guard.enabled}


def _owner(torch: Any, where: str) -> Any:
    if where == "Tensor":
        return torch.Tensor
    obj = torch
    if where == "torch":
        return obj
    for part in where.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


#: The collector of this module, for registry.py.
COLLECTOR = CollectorSpec("host_syncs", 85, lambda b: HostSyncCounter(b.clock, b.rank),
                          tables=(TABLE,))
