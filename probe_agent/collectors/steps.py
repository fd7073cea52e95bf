"""StepRecorder: ``python.steps``, ``python.memory`` and ``python.metrics``.

What gets captured
------------------
- **steps**: one row per optimizer step counted by the agent's StepClock (every step, traced or
  not): when it ended, how long since the previous one ended (so data loading counts), and
  samples/s when the number of samples is known (``probe_agent.log(samples=N)``, or the first
  dimension of the root model's first input in traced steps).
- **memory**: one row per step per device. On CUDA (only once the job has initialised CUDA;
  nothing here creates a context): allocated, reserved, active, peak, alloc retries and OOMs
  from ``torch.cuda.memory_stats()`` of the current device. Always: the process RSS, and the
  agent's own share of it (``agent_mib``: its in-memory DuckDB and Arrow buffers, sampled on
  the writer thread every ``AGENT_SAMPLE_S``; ``agent_threads``), and the free bytes malloc
  keeps (``heap_free_mib``, heap.py), so that a leak check can judge the job's memory
  (rss - agent_mib - heap_free_mib) and blame the user neither for the agent's tables nor for
  the allocator's fragmentation. On traced steps also the memory by kind: parameters,
  gradients and optimizer state this rank holds (memory_kinds.py, the local shard under
  FSDP2), and the activations the largest forward pass saved for backward
  (tracer/saved_bytes.py).
- **metrics**: the user's own scalars from ``probe_agent.log(step=…, loss=…, **scalars)``, so
  that "loss became NaN at step N" is a query.

Cost
----
Per step on the training thread: one ``pread`` of ``/proc/self/statm`` (~2 µs), two small tuple
appends, and on CUDA one ``memory_stats`` call. ``log()`` appends one tuple per scalar; tensor
values are converted (``.item()``) on the writer thread, never on the training thread.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from . import Guard, Sink
from .heap import free_heap_mib
from .loss import to_float
from .memory_kinds import count_kinds, grad_bytes
from .placement import Placement
from .registry import CollectorSpec
from .schedstat import ThreadSchedstat
from .throughput import ThroughputMeter

if TYPE_CHECKING:
    from ..clock import StepClock
    from .numerics import NumericsRecorder
    from .tracer.tracer import TorchTracer

_MIB = 1.0 / (1 << 20)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
BUFFER = 100_000
#: How often the writer thread asks DuckDB how much memory it holds (a cheap catalog query).
AGENT_SAMPLE_S = 2.0
TABLES = ("python.steps", "python.memory", "python.metrics", "python.module_flops")


class StepRecorder:
    """Collector for python.steps / python.memory / python.metrics.

    Args:
        clock: the agent's step clock; its steps drive the rows.
        rank: written into every row.
        tracer: when present, says which steps were traced and what their root calls were fed.
        run_dir: where a measured CPU peak is shared with the node's other ranks (peak.py).
    """

    def __init__(self, clock: StepClock, rank: int, tracer: TorchTracer | None,
                 run_dir: str, numerics: NumericsRecorder | None = None) -> None:
        self.clock = clock
        self.numerics = numerics  # the step's loss (loss.py), when it runs
        self.rank = rank
        self.tracer = tracer
        self.guard = Guard("step recorder")
        self.steps: list[tuple[Any, ...]] = []
        self.memory: list[tuple[Any, ...]] = []
        self.metrics: list[tuple[Any, ...]] = []
        self.module_flops: list[tuple[Any, ...]] = []  # of the FLOP-measured step
        self.logged_samples: dict[int, int] = {}
        self.logged_tokens: dict[int, int] = {}
        self.logged_loss: dict[int, Any] = {}
        self.throughput = ThroughputMeter(run_dir)
        self._last_end: float | None = None
        self._sched = ThreadSchedstat()
        self._last_sched: tuple[float, float] | None = None
        self._place = Placement()
        self._statm: int | None = None
        self._unsubscribe: Any = None
        self.sink: Sink | None = None
        self._schemas: dict[str, pa.Schema] = {}
        self._pending: list[Any] | None = None
        self._lock = threading.Lock()
        # The agent's own memory, read by the training thread as one tuple (atomic swap).
        self._agent: tuple[float | None, int | None, float | None] = (None, None, None)
        self._capacity: dict[int, float] = {}  # MiB of each CUDA device
        self._last_kinds: tuple[Any, ...] | None = None  # of the last traced step
        self._count_memo: tuple[Any, Any, Any] | None = None  # count_kinds while nothing changed
        self._agent_at = 0.0

    # -- collector protocol ------------------------------------------------------------------
    def start(self, sink: Sink) -> None:
        self.sink = sink
        self._schemas = {t: sink.arrow_schema(t) for t in TABLES}
        try:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._statm = None
        self._unsubscribe = self.clock.subscribe(self._on_step, "step recorder")
        sink.add_flusher(self.flush)
        sink.add_ticker(self._sample_agent)

    def stop(self) -> None:
        try:
            if self._unsubscribe is not None:
                self._unsubscribe()
            self.flush(final=True)
        finally:
            self.throughput.meter.release()  # its dispatch mode must not outlive the agent
            self._sched.close()
            if self._statm is not None:
                os.close(self._statm)
                self._statm = None

    # -- writer thread: the agent's own memory ------------------------------------------------
    def _sample_agent(self) -> None:
        """DuckDB's memory (the sink's ``memory_bytes``: tables, buffers), the Arrow buffers in
        flight (pyarrow's pool) and the agent's threads. A failure here only leaves the columns
        NULL."""
        now = time.monotonic()
        if now - self._agent_at < AGENT_SAMPLE_S or self.sink is None:
            return
        self._agent_at = now
        try:
            # + the Arrow buffers the agent's collectors hold between flushes (pyarrow's pool)
            db = (self.sink.memory_bytes() + pa.total_allocated_bytes()) * _MIB
            threads = sum(1 for t in threading.enumerate() if t.name.startswith("probe"))
            self._agent = (db, threads, free_heap_mib())
        except Exception as e:  # noqa: BLE001 - writer thread: counted, never raised
            self.guard.failed(e)

    # -- training thread ---------------------------------------------------------------------
    def rss_mib(self) -> float | None:
        fd = self._statm
        if fd is None:
            return None
        fields = os.pread(fd, 128, 0).split()
        return int(fields[1]) * _PAGE * _MIB

    def _on_step(self, step: int, optimizer: Any) -> None:
        # The step ran from the end of the last boundary's agent work to this boundary; that
        # work (a scheduled heap walk, the CPU peak probe, an action) is its own column.
        now = self.clock.last_step_at or time.time()
        start, self._last_end = self._last_end, now
        boundary = self.clock.boundary
        agent_s = None
        if start is not None and boundary is not None and boundary[0] == start:
            start, agent_s = boundary[1], boundary[1] - boundary[0]
        sched, prev = self._sched.read(), self._last_sched
        self._last_sched = sched
        cpu = (max(0.0, sched[0] - prev[0]), max(0.0, sched[1] - prev[1])) \
            if sched is not None and prev is not None and start is not None else (None, None)
        place = self._place.read()
        tracer = self.tracer
        traced = False
        batch = None
        torch = sys.modules.get("torch")
        if tracer is not None:
            traced = bool(tracer.recording)
            batch = tracer.boundaries.pop_batch(step)
        samples = batch.samples if batch is not None else None
        work = None
        if torch is not None:
            try:
                work = self.throughput.at_step(torch, step, optimizer, batch, tracer)
                meter = self.throughput.meter
                if work.flops is not None and meter.by_module:
                    t = time.time()
                    self.module_flops.extend((t, step, *w) for w in meter.by_module[:BUFFER])
                    meter.by_module = []
            except Exception as e:  # noqa: BLE001 - training thread: counted, never raised
                self.guard.failed(e)
        duration = now - start if start is not None else None
        loss, source = None, None
        if self.numerics is not None:
            loss, source, _ = self.numerics.loss_for_step()
        # Held until the next step (or a second): log(samples=N) usually comes right after
        # optimizer.step(), i.e. after this hook.
        with self._lock:
            self._finish_pending()
            self._pending = [step, start, now, duration, samples, traced, work, agent_s, cpu,
                             loss, source, place]
        rss = self.rss_mib()
        kinds = self._kinds(torch, optimizer) if traced else _NO_KINDS
        if kinds[0] is not None:
            self._last_kinds = kinds
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            dev = cuda.current_device()
            s = cuda.memory_stats(dev)
            cap = self._capacity.get(dev)
            if cap is None:  # cached device properties: no context, no synchronisation
                cap = self._capacity[dev] = cuda.get_device_properties(dev).total_memory * _MIB
            row = (now, step, f"cuda:{dev}",
                   s.get("allocated_bytes.all.current", 0) * _MIB,
                   s.get("reserved_bytes.all.current", 0) * _MIB,
                   s.get("active_bytes.all.current", 0) * _MIB,
                   s.get("allocated_bytes.all.peak", 0) * _MIB,
                   s.get("num_alloc_retries", 0), s.get("num_ooms", 0), rss, *self._agent,
                   *kinds, cap)
        else:
            row = (now, step, "cpu", None, None, None, None, None, None, rss, *self._agent,
                   *kinds, None)
        if len(self.memory) < BUFFER:
            self.memory.append(row)

    def last_kinds(self) -> dict[str, Any]:
        """The last traced step's memory by kind (MiB; empty before one), for the OOM record."""
        k = self._last_kinds
        if k is None:
            return {}
        return dict(zip(("params_mib", "grads_mib", "optimizer_mib", "activations_mib"), k))

    def _kinds(self, torch: Any, optimizer: Any) -> tuple[Any, ...]:
        """Parameters, gradients, optimizer state and activations (MiB) of a traced step."""
        tracer = self.tracer
        if torch is None or tracer is None:
            return _NO_KINDS
        try:
            params = tracer.boundaries.trained_params(optimizer)
            opts = [optimizer, *(tracer.boundaries.optimizers or ())]
            # Parameters and optimizer state are counted again when the parameter list (kept
            # by the tracer for at most a second) or an optimizer's state changes: ~1 us a
            # tensor, 0.2 ms a step for 100 parameters. Gradients come and go: every step.
            key = tuple((id(x), id(getattr(x, "state", None)),
                         len(getattr(x, "state", None) or ())) for x in opts)
            cached = self._count_memo
            if cached is not None and cached[0] == key and cached[1] is params:
                p, g, o, p32, sharded = cached[2]
                g = grad_bytes(torch, params)
            else:
                counts = count_kinds(torch, params, opts)
                self._count_memo = (key, params, counts)
                p, g, o, p32, sharded = counts
            saved = tracer.saved
            act = saved.step_bytes() * _MIB if saved.pushed and saved.enabled else None
            return p * _MIB, g * _MIB, o * _MIB, act, p32 * _MIB, sharded
        except Exception as e:  # noqa: BLE001 - training thread: counted, never raised
            self.guard.failed(e)
            return _NO_KINDS

    def _finish_pending(self) -> None:
        """Move the held step row into the buffer (caller holds ``_lock``)."""
        p, self._pending = self._pending, None
        if p is None:
            return
        step, start, end, duration, samples, traced, work, agent_s, cpu, loss, source, place = p
        logged_loss = self.logged_loss.pop(step, None)
        if logged_loss is not None:  # probe_agent.log(loss=...) overrides what was seen
            loss, source = logged_loss, "logged"
        logged = self.logged_samples.pop(step, None)
        samples = logged if logged is not None else samples
        rate = samples / duration if samples and duration else None
        tput = self.throughput.columns(work, self.logged_tokens.pop(step, None), duration)
        if len(self.steps) < BUFFER:
            self.steps.append((step, start, end, duration, samples, rate, traced, *tput,
                               agent_s * 1e3 if agent_s is not None else None,
                               *(None if x is None else x * 1e3 for x in cpu), loss, source,
                               *place))

    def log(self, step: int | None, scalars: dict[str, Any]) -> None:
        """``probe_agent.log``: called on the user's thread; never raises into it."""
        if not self.guard.enabled:
            return
        try:
            if step is None:
                step = self.default_step()
            now = time.time()
            for name, value in scalars.items():
                if name in ("samples", "tokens") and isinstance(value, int):
                    counts = self.logged_samples if name == "samples" else self.logged_tokens
                    if len(counts) > 1000:  # steps that never finished
                        counts.clear()
                    counts[step] = counts.get(step, 0) + value
                if hasattr(value, "detach"):
                    value = value.detach()  # .item() waits for the GPU: the writer does it
                if name == "loss":
                    if len(self.logged_loss) > 1000:
                        self.logged_loss.clear()
                    self.logged_loss[step] = value
                if len(self.metrics) < BUFFER:
                    self.metrics.append((now, step, str(name), value))
        except Exception as e:  # noqa: BLE001 - user thread; counted, never raised
            self.guard.failed(e)

    def default_step(self) -> int:
        """The last finished optimizer step (``log`` usually follows ``optimizer.step()``);
        without an optimizer, the tracer's count of root-model calls."""
        if self.clock.seen_step:
            return int(self.clock.current_step)
        return int(getattr(self.tracer, "step", 0))

    # -- writer thread -----------------------------------------------------------------------
    def flush(self, final: bool = False) -> None:
        # Called every PROBE_FLUSH_MS and before every read (the Store decides when).
        with self._lock:
            p = self._pending
            if p is not None and (final or time.time() - p[2] > 1.0):
                self._finish_pending()
        rank, sink, schema = self.rank, self.sink, self._schemas
        if sink is None:
            return  # not started: nothing recorded yet
        steps, memory, metrics = _drain(self.steps), _drain(self.memory), _drain(self.metrics)
        work = _drain(self.module_flops)
        if work:
            cols = list(zip(*work))
            sink.append("python.module_flops", pa.table(
                [cols[0], [rank] * len(work), *cols[1:]], schema=schema["python.module_flops"]))
        if steps:
            cols = list(zip(*steps))
            cols[_LOSS] = tuple(to_float(v) for v in cols[_LOSS])  # read off the device here
            sink.append("python.steps", pa.table(
                [[rank] * len(steps), *cols], schema=schema["python.steps"]))
        if memory:
            cols = list(zip(*memory))
            sink.append("python.memory", pa.table(
                [cols[0], [rank] * len(memory), *cols[1:]], schema=schema["python.memory"]))
        if metrics:
            values = [_number(v) for _, _, _, v in metrics]
            sink.append("python.metrics", pa.table(
                [[m[0] for m in metrics], [rank] * len(metrics), [m[1] for m in metrics],
                 [m[2] for m in metrics], values], schema=schema["python.metrics"]))


_NO_KINDS: tuple[Any, ...] = (None, None, None, None, None, None)
#: Where the loss sits in a steps row (before loss_source and Placement's 3 columns).
_LOSS = -5


def _drain(buf: list[Any]) -> list[Any]:
    n = len(buf)
    out = buf[:n]
    del buf[:n]
    return out


def _number(value: Any) -> float | None:
    try:
        if hasattr(value, "item"):
            value = value.item()
        return float(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return math.nan


#: This collector, for the registry (registry.py).
COLLECTOR = CollectorSpec(
    "steps", 30, needs=("tracer", "numerics"),
    tables=("python.steps", "python.memory", "python.metrics", "python.module_flops"),
    build=lambda b: StepRecorder(b.clock, b.rank, b.get("tracer"), b.config.run_dir,
                                 b.get("numerics")))
