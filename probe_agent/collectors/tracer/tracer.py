"""TorchTracer: forward, backward and optimizer-step time of every ``nn.Module`` -> torch_trace.

What gets captured
----------------------------
- **forward**: one row per module call, host wall time around the call (on CUDA also a pair of
  CUDA events, resolved later on the writer thread without synchronising).
- **backward**: one row per forward call whose output has a ``grad_fn``. The start of that
  node in autograd marks the start of the module's backward (the event names the node by its
  sequence number, which the forward record carries too); the span ends when autograd reaches
  the node of the call's input (its first tensor argument's ``grad_fn``: the gradient for the
  input is done), or earlier at the next backward start of a module call that is neither
  inside nor around it in the forward (or at the end of the backward pass). So a parent's own
  ops between its children (GPT-2's attention core between ``c_proj`` and ``c_attn``, a
  block's residual adds) are the parent's self time, not the child's before them; a call whose
  input has no ``grad_fn`` (the data) ends at the next start. Modules whose outputs share one
  ``grad_fn`` (a ``Sequential`` and its last layer) share its start.
- **step**: one row per ``optimizer.step()`` of every ``torch.optim.Optimizer``.
- Activation checkpointing: forward calls made while a backward runs (the recompute) are
  **flagged** ``recompute = true``, not dropped; the canned queries leave them out.
- ``torch.compile``: nothing is recorded inside compiled code (``torch.compiler.is_compiling()``
  short-circuits the wrapper, so dynamo sees no graph break). A compiled model records one row
  per call of the compiled wrapper (named after the model) with its backward, plus the
  optimizer step; modules that run eagerly (around graph breaks) record as usual.

How (and why not hooks)
-----------------------
``nn.Module.__call__`` is replaced while a traced step runs, and restored in other steps, so
untraced steps cost nothing. Global forward hooks would do the same job but any global hook
sends *every* module call through ``_call_impl``'s slow path (+4.3 µs per call measured here),
and ``torch.compile``'d modules warn about them. Full backward hooks cost +55% and break
in-place ops. Two hot paths record the same rows (no sys.settrace/setprofile):
- C++ (``trace_native.py``), for CPU steps once built: the call's work in C++, and backward
  from a RecordFunction callback that keeps the nodes forward records name (no per-node
  registration, no Python);
- Python (``trace_hot.py``), before that, on CUDA steps and without a compiler: a Python
  wrapper, and ``grad_fn.register_prehook`` on each call's output for backward.

Step numbers come from the agent's StepClock (one global optimizer post-hook): rows of the
work leading up to optimizer step N carry step N; what happens at a step boundary is
``trace_steps.py``. Jobs with no ``torch.optim`` optimizer: the first ``FALLBACK_AFTER`` calls
of the root model are step 1, then each call counts as a step.

State, by owner: ``TorchTracer`` keeps what the hot paths read per call (``step``,
``recording``, ``cuda``, ``depth``, ``in_backward``, ``root``, the pending grad_fns) and the
controls (mode, arming, installing the wrapper); ``Records`` (``records.py``) the buffers both
hot paths and the step boundaries fill and the writer takes; ``StepBoundaries``
(``trace_steps.py``) what is known between steps; ``Writer`` (``trace_flush.py``) the resolver
and the store.

Cost
----
Records are numbers in bounded buffers (``array('q')`` in Python, ``std::vector`` in C++), which
allocate nothing the garbage collector tracks (why that matters: ``trace_columns.py``); the writer
thread resolves them in SQL (``trace_rows.py``). Failures inside the wrapper or the hooks are
counted by a ``Guard``; after repeated failures tracing switches itself off.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from ... import optim_hooks
from .. import Guard, Sink
from ..registry import CollectorSpec
from ..torch_import import TorchImportWatcher, torch_ready
from . import trace_hot
from .records import Records
from .saved_bytes import SavedBytes
from .trace_columns import FORWARD
from .trace_flush import TABLE as _TABLE
from .trace_flush import Writer
from .trace_native import LOADER
from .trace_rows import RowResolver
from .trace_steps import FALLBACK_AFTER, StepBoundaries

if TYPE_CHECKING:
    from ...clock import StepClock
    from ...config import AgentConfig

log = logging.getLogger(__name__)

__all__ = ["FALLBACK_AFTER", "TorchTracer", "parse_mode"]
_MODE_RE = re.compile(r"^(on|off|every:([1-9][0-9]*))$")

def parse_mode(mode: str) -> tuple[str, int]:
    """``"on"`` -> ("on", 1); ``"every:5"`` -> ("every", 5); raises ValueError otherwise."""
    m = _MODE_RE.match(mode.strip().lower())
    if not m:
        raise ValueError(f"trace mode {mode!r} is not one of on, off, every:N (N >= 1)")
    if m.group(2):
        return "every", int(m.group(2))
    return m.group(1), 1


class TorchTracer:
    """Collector for ``python.torch_trace``; see the module docstring.

    Args:
        stepclock: the agent's step clock: traced steps follow its numbering.
        rank: written into every row.
        config: ``trace`` (the start mode) and ``trace_native`` (whether to use the C++ path).
    """

    def __init__(self, stepclock: StepClock, rank: int, config: AgentConfig) -> None:
        self.stepclock = stepclock
        self.rank = rank
        self.mode = config.trace
        self._kind, self._every = parse_mode(self.mode)
        self.guard = Guard("module tracer")
        self.clock = time.perf_counter_ns
        # hot-path state (training thread; the C++ path reads step, recording and root too)
        self.depth = 0
        self.recording = False
        self.in_backward = FORWARD  # the kind of a forward row now: RECOMPUTE in backward
        self.step = 1
        self.root: Any = None
        #: the last root module that has parameters: the model, where ``root`` can be a loss
        #: module called at top level after it (DeepSpeedExamples' CIFAR: nn.CrossEntropyLoss)
        self.params_root: Any = None
        self.cuda = False
        self.last_gf: Any = None
        self.hook_gfs: list[Any] = []  # grad_fns waiting for their pre-hook (trace_hot)
        self.queue_callback: Any = None
        self.records = Records(self.clock)  # filled here, taken by the writer
        # activations saved for backward (saved_bytes.py); inputs recorded in the wrapper
        self.saved = SavedBytes(self.clock, inputs=trace_hot.set_inputs)
        self.boundaries = StepBoundaries(self)
        self.writer = Writer(self.records, self.saved)
        # control state
        self.armed = False
        self.installed = False
        self._dynamo_skips = False  # trace_hot.skip_in_dynamo() done (on_root)
        self._handles: list[Any] = []
        self._unsubscribe: Any = None
        self._watcher: TorchImportWatcher | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self.torch: Any = None
        self.native_mode = config.trace_native  # auto | off, read at each step boundary
        self.db_memory_mb = config.db_memory_limit_mb  # the resolver's database's limit too
        self.native: Any = None  # the C++ hot path once bound to it (trace_native.py)
        self.on_native = False  # installed steps use it

    # -- collector protocol ------------------------------------------------------------------
    def start(self, sink: Sink) -> None:
        self.writer.start(sink, RowResolver(self.rank, sink.arrow_schema(_TABLE),
                                            self.stepclock.optimizers, self.db_memory_mb))
        sink.add_flusher(self.tick)
        if torch_ready():
            self.arm()
        else:
            self._watcher = TorchImportWatcher(self._on_torch_imported)
            self._watcher.install()

    def stop(self) -> None:
        self._stopped = True
        try:
            if self._watcher is not None:
                self._watcher.remove()
            self._uninstall()
            for h in self._handles:
                h.remove()
            if self._unsubscribe is not None:
                self._unsubscribe()
        finally:
            self._handles.clear()
            # the hooks are on the training thread's stack: only that thread can pop them;
            # until it does they pass tensors through
            self.saved.release(self.torch)
            trace_hot.unbind(self)
            self.armed = False
            self.flush()
            self.writer.close()

    def flush(self) -> None:
        """Resolve the buffered records into the store now. The writer thread calls ``tick``
        every PROBE_FLUSH_MS and before every read; tests and ``stop()`` call this directly."""
        if not self.armed and not self._stopped and self._watcher is not None and torch_ready():
            self._on_torch_imported()  # imported by a route the watcher did not see
        self.writer.flush(self.native)

    def tick(self) -> None:
        """The writer's pass (the sink's flusher): resolve when the writer says it is due."""
        if self.writer.due(self.native):
            self.flush()

    # -- arming ------------------------------------------------------------------------------
    def _on_torch_imported(self) -> None:
        try:
            self.stepclock.poll()
            self.arm()
        except Exception as e:  # noqa: BLE001 - runs inside the program's `import torch`
            self.failed(e)

    def arm(self) -> None:
        """Install the optimizer hooks and, unless the mode is off, start tracing now."""
        with self._lock:
            if self.armed:
                return
            torch = sys.modules["torch"]
            from torch.autograd.variable import Variable
            from torch.optim import optimizer as optimizer_mod

            self.torch = self.records.torch = torch
            self.queue_callback = Variable._execution_engine.queue_callback
            # copy-on-write (optim_hooks.py): the training thread may be iterating them now
            self._handles = [
                optim_hooks.register(optimizer_mod, "pre", self.boundaries.on_opt_pre),
                optim_hooks.register(optimizer_mod, "post", self.boundaries.on_opt_post),
            ]
            clock = self.stepclock
            clock.poll()
            self._unsubscribe = clock.subscribe(self.boundaries.on_step, "module tracer")
            if clock.seen_step:
                self.boundaries.start_after(clock.current_step)
            if self.writer.resolver is not None:
                self.writer.resolver.torch = torch
            trace_hot.bind(self, torch)
            self.armed = True
            self.apply_mode(boundary=True)

    # -- mode --------------------------------------------------------------------------------
    def set_mode(self, mode: str) -> dict[str, Any]:
        """Change the mode at run time (HTTP thread). With an optimizer it takes effect at the
        next step boundary; before any optimizer step it takes effect at once."""
        kind, every = parse_mode(mode)
        self.mode = "on" if kind == "on" else "off" if kind == "off" else f"every:{every}"
        self._kind, self._every = kind, every
        if self.armed and self.boundaries.fallback:
            self.apply_mode(boundary=False)
        return self.state()

    def traced(self, step: int) -> bool:
        if self._kind == "on":
            return True
        if self._kind == "off":
            return False
        return step % self._every == 0

    def apply_mode(self, boundary: bool) -> None:
        """Install or remove the wrapper for the step now starting (``self.step``)."""
        want = self.traced(self.step) and self.guard.enabled
        # Before an optimizer is seen the wrapper stays on (it counts root calls as steps),
        # recording only in traced steps.
        install = want or (self.boundaries.fallback and self._kind != "off"
                           and self.guard.enabled)
        torch = self.torch
        self.cuda = bool(want and torch is not None and torch.cuda.is_initialized())
        self.recording = want
        if boundary:
            self.depth = 0
            self.last_gf = None
            self.hook_gfs = []
        native = install and not self.cuda and self._native_ready()
        if install and (not self.installed or native != self.on_native):
            trace_hot.install(torch, native=native)
            self.installed, self.on_native = True, native
        elif not install and self.installed:
            self._uninstall()
        if self.native is not None:
            self.native.sync(self.step, self.recording, self.root, boundary)

    def hot_path_text(self) -> str:
        """``native`` or ``python (why)``: what `probe info` and `probe trace` show."""
        if self.native_mode == "off":
            return "python (off: PROBE_TRACE_NATIVE=off)"
        return LOADER.describe()

    def _native_ready(self) -> bool:
        """The C++ hot path is loaded (its first request starts loading it) and bound here."""
        LOADER.request(self.torch, self.native_mode)
        mod = LOADER.module if self.native_mode != "off" else None
        if mod is not None and self.native is not mod:
            trace_hot.bind_native(self, mod)
            self.native = mod
        return mod is not None

    def _uninstall(self) -> None:
        if self.torch is not None:
            trace_hot.uninstall(self.torch)
        self.installed = self.on_native = False
        self.recording = False

    # -- training-thread callbacks -------------------------------------------------------------
    def on_root(self, module: Any, args: tuple[Any, ...], kwargs: Any = None) -> None:
        """A module called with no traced module around it (once or a few times per step)."""
        try:
            if not self._dynamo_skips and "torch._dynamo" in sys.modules:
                self._dynamo_skips = trace_hot.skip_in_dynamo(
                    (self.on_root, self.failed, self.records.record_event, self.records.memory,
                     self.saved._on_input))
            if self.in_backward:
                return  # activation-checkpoint recompute, not a new step
            if module is not self.root and module is not self.params_root and next(
                    module.parameters(), None) is not None:  # only when the root changes
                self.params_root = module
            self.root = module
            self.boundaries.root_called(module, args, kwargs)
        except Exception as e:  # noqa: BLE001 - training thread
            self.failed(e)


    # -- failures ----------------------------------------------------------------------------
    def failed(self, exc: BaseException) -> None:
        self.guard.failed(exc)
        if not self.guard.enabled:
            self.recording = False
            self.cuda = False
            trace_hot.unbind(self)  # the wrapper becomes a pass-through at once

    def state(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "armed": self.armed,
            "tracing_now": self.recording,
            "step": self.step,
            "fallback_steps": self.boundaries.fallback,
            "failures": self.guard.failures,
            "disabled": not self.guard.enabled,
            "last_error": self.guard.last_error,
            "dropped_rows": self.records.dropped,
            "cuda_events": self.cuda,
            "hot_path": "native" if self.on_native else "python",
            "native_build": self.hot_path_text(),
            "saved_bytes": {"counting": self.saved.pushed and self.saved.enabled,
                            "failures": self.saved.failures,
                            "last_error": self.saved.last_error},
        }


#: This collector, for the registry (registry.py).
COLLECTOR = CollectorSpec("tracer", 40, lambda b: TorchTracer(b.clock, b.rank, b.config),
                          tables=("python.torch_trace",))
