"""CompileWatcher: whether this rank runs torch.compile'd code -> ``python.compile_state``.

Read from what torch itself reports, at each optimizer step on the training thread:
``torch._dynamo.utils.counters`` (frames compiled, graphs captured, graph breaks by reason) and
dynamo's compilation metrics (``recompile_reason`` of each compilation), only once the program
has imported ``torch._dynamo`` (the agent never imports it). Reading them compiles nothing,
installs no hook and touches no module, so it adds no recompile. A row is written when the
counts change, and at steps 1, 10, 100, 1000, ... (so an uncompiled job says so too).

Which modules run compiled (an ``OptimizedModule`` from ``torch.compile(model)``, or a module
whose ``compile()`` was called) needs the model: a heap walk (model_scan.py), done only when
dynamo has compiled frames, at most ``SCANS`` times (the first change seen, then at steps 10,
100, ...).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from . import Guard, Sink
from .registry import CollectorSpec
from .row_buffer import RowBuffer

if TYPE_CHECKING:
    from ..clock import StepClock

TABLE = "python.compile_state"
#: Module scans per run (each a heap walk).
SCANS = 4
#: Compiled submodules named in a row.
MAX_NAMES = 20


class CompileWatcher:
    """Collector for ``python.compile_state``; see the module docstring."""

    def __init__(self, clock: StepClock, rank: int) -> None:
        self.clock = clock
        self.rank = rank
        self.guard = Guard("compile state")
        self.rows = RowBuffer(TABLE)  # python.compile_state rows, flushed by the writer
        self._unsubscribe: Any = None
        self._last: tuple[Any, ...] | None = None
        self._next_read = 1
        self._scans = 0
        self._next_scan = 0
        self._modules: tuple[bool | None, str | None] = (None, None)
        self._recompiles = 0
        self._last_reason: str | None = None
        self._metric_seen: Any = None  # the last compilation metric counted

    def start(self, sink: Sink) -> None:
        self.rows.start(sink)
        self._unsubscribe = self.clock.subscribe(self._on_step, "compile state")
        sink.add_flusher(self.flush)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.flush()

    # -- training thread ---------------------------------------------------------------------
    def _on_step(self, step: int, optimizer: Any) -> None:
        try:
            counts = self._counts()
            changed = counts != self._last
            due = step >= self._next_read
            if not changed and not due:
                return
            if due:
                self._next_read = max(10, 10 * step)
            if changed and counts[0] and counts[1] and self._scans < SCANS and (
                    self._scans == 0 or step >= self._next_scan):
                self._scan(optimizer)
                self._next_scan = max(10, 10 * step)
            self._last = counts
            if not self.rows.full():
                self.rows.add((time.time(), self.rank, step, *counts, *self._modules))
        except Exception as e:  # noqa: BLE001 - training thread: counted, never raised
            self.guard.failed(e)

    def _counts(self) -> tuple[Any, ...]:
        """(dynamo, frames, graphs, graph_breaks, top_break, recompiles, last_recompile)."""
        utils = sys.modules.get("torch._dynamo.utils")
        counters = getattr(utils, "counters", None)
        if counters is None:
            return (False, 0, 0, 0, None, 0, None)
        frames = int(counters["frames"].get("total", 0))
        graphs = int(counters["stats"].get("unique_graphs", 0))
        breaks = counters["graph_break"]
        n_breaks = int(sum(breaks.values()))
        top = max(breaks.items(), key=lambda kv: kv[1])[0] if breaks else None
        if self._last is None or frames != self._last[1]:
            self._read_recompiles(utils)
        return (True, frames, graphs, n_breaks,
                str(top).strip().splitlines()[0][:200] if top else None,
                self._recompiles, self._last_reason)

    def _read_recompiles(self, utils: Any) -> None:
        """Count the compilations dynamo says were recompiles, new since the last read (its
        metrics are a bounded deque: walk back from the newest to the one seen last)."""
        get = getattr(utils, "get_compilation_metrics", None)
        if get is None:
            return
        metrics = list(get())
        new = []
        for m in reversed(metrics):
            if m is self._metric_seen:
                break
            new.append(m)
        if metrics:
            self._metric_seen = metrics[-1]
        for m in reversed(new):  # oldest first: the newest reason is kept
            reason = getattr(m, "recompile_reason", None)
            if reason:
                self._recompiles += 1
                self._last_reason = str(reason).strip().splitlines()[0][:200]

    def _scan(self, optimizer: Any) -> None:
        torch = sys.modules.get("torch")
        if torch is None:
            return
        from .model_scan import ModelScan

        self._scans += 1
        scan = ModelScan(torch)
        trained = _trained_params(optimizer)
        root = False
        names: list[str] = []
        for m in scan.modules:
            compiled = type(m).__name__ == "OptimizedModule" or \
                getattr(m, "_compiled_call_impl", None) is not None
            if not compiled:
                continue
            inner = getattr(m, "_orig_mod", m)
            # only the model being trained: another compiled model alive in the process (a
            # frozen teacher, an earlier run's) says nothing about this one's steps
            if trained and not any(id(p) in trained for p in inner.parameters()):
                continue
            if scan.is_root(m):
                root = True
            else:
                names.append(scan.name(inner))
        self._modules = (root, ", ".join(sorted(set(names))[:MAX_NAMES]) or None)

    # -- writer thread -----------------------------------------------------------------------
    def flush(self) -> None:
        self.rows.flush()


#: The collector of this module, for registry.py.
COLLECTOR = CollectorSpec("compile_state", 86, lambda b: CompileWatcher(b.clock, b.rank),
                          tables=(TABLE,))


def _trained_params(optimizer: Any) -> set[int]:
    """ids of the parameters ``optimizer`` steps (empty when it has none we can read)."""
    try:
        return {id(p) for g in optimizer.param_groups for p in g["params"]}
    except (AttributeError, KeyError, TypeError):
        return set()
