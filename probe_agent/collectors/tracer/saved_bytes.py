"""SavedBytes: the bytes autograd saves for backward on traced steps, by the time they were saved.

What gets captured
------------------
A default ``saved_tensors_hooks`` pack hook is pushed on the training thread for traced steps
(and popped after them). Each tensor autograd saves is counted once per forward pass by its
storage (views share storage: ``x`` and ``x.t()`` saved by two ops count once), leaving out
parameters' storages (a weight saved by ``linear`` is not an activation). The hook records
``(perf_counter_ns, bytes)``; the writer attributes each record to the innermost module call
whose forward span holds that time (trace_rows.py), which is the module's OWN saved bytes.

Counting never keeps a tensor alive: the set holds storage addresses (ints), and the hook
returns ``tensor.detach()`` as torch's docs ask (returning the tensor itself makes a saved
output hold its own ``grad_fn``: a cycle). A user's hooks still pushed at the boundary: ours
are not pushed for that step (ours on top would be what their context pops on exit, leaving
theirs on for good). A user's hooks pushed above ours during the step (offloading,
non-reentrant checkpointing) win, and what they save is theirs, not counted.

Not pushed: when torch.compile has compiled frames in this process (AOTAutograd would trace our
hook into its graphs), or after a failure. ``torch.func.grad``/``vjp``/``jacrev`` refuse to run
under any saved-tensor hooks (they raise), so ``torch.autograd.graph.disable_saved_tensors_hooks``,
which they enter, is wrapped once: ours are lifted for the duration and pushed back after.

Inputs: what checkpointing a module would keep is its inputs, so the tracer's wrapper records
the bytes of each call's tensor arguments (their storages, once per call) on the same timeline,
inside the call's span; the writer gives them to the call itself (``input_bytes``).

Cost: one Python call per saved tensor on traced steps (~1.5 us: storage, a set lookup, a
detach), and one per module call for its inputs (~1 us; a global pre-hook cost ~5 us with
torch's slower call path); bench/bench_memory_accounting.py measures it against tracing
without it.
"""

from __future__ import annotations

import contextlib
import struct
import sys
import threading
from array import array
from collections.abc import Iterator
from typing import Any

from ... import optim_hooks, patches

#: (time, bytes, kind) records buffered between two writer resolves; beyond it they are dropped.
SV_MAX = 600_000
SV_N = 3
SAVED, INPUT = 0, 1  # a tensor saved for backward; the tensors a module call got
_pack_sv = struct.Struct("3q").pack


class SavedBytes:
    """The pack hook and its per-pass bookkeeping; the tracer owns one (training thread)."""

    def __init__(self, clock: Any, enabled: bool = True, inputs: Any = None) -> None:
        """``inputs``: puts a ``(module, args)`` recorder into the tracer's own wrapper of
        ``nn.Module.__call__`` (``trace_hot.set_inputs``: ``inputs(fn)`` on, ``inputs(None,
        fn)`` off); without it a global forward pre-hook records the inputs."""
        self.clock = clock
        self._inputs = inputs
        self._inputs_set = False
        self.enabled = enabled
        self.buf = array("q")  # (t, nbytes) records, taken by the writer
        self.seen: set[int] = set()  # storage addresses counted in this forward pass
        self.skip: set[int] = set()  # parameters' storages
        self.total = 0  # bytes counted in this forward pass
        self.peak = 0  # the largest pass of this step (gradient accumulation: several passes)
        self.pushed = False
        self._push_thread = 0  # the thread whose saved-tensors stack holds our hook
        self._pre_handle: Any = None  # the global forward pre-hook while pushed
        self.steps: list[int] = []  # traced steps counted, taken by the writer with ``buf``
        self.torch: Any = None
        self.foreign_skips = 0  # traced steps not counted: the job's own hooks were pushed
        self.failures = 0
        self.last_error: str | None = None

    # -- step boundaries (training thread) ----------------------------------------------------
    def switch(self, torch: Any, on: bool, step: int, params: Any) -> None:
        """Called at each step boundary: ``on`` when ``step`` (starting now) is traced. Resets
        the step's counts, pushes the hooks for a traced step and pops them after one."""
        self.seen.clear()
        self.total = self.peak = 0
        want = on and self.enabled and not compiled_here()
        self.torch = torch
        if want:
            skip = set()
            for p in params:
                try:
                    skip.add(_local(p).untyped_storage().data_ptr())
                except (RuntimeError, NotImplementedError, TypeError):
                    pass
            self.skip = skip
        if want and not self.pushed:
            self._push(torch)
        elif not want and self.pushed:
            self._pop(torch)
        if want and self.pushed and len(self.steps) < 4096:
            self.steps.append(step)

    def new_pass(self) -> None:
        """A root call after a backward: a new forward pass (gradient accumulation). The last
        pass's tensors are freed, so their addresses may come back: count afresh."""
        if self.total:
            self.peak = max(self.peak, self.total)
            self.total = 0
            self.seen.clear()

    def step_bytes(self) -> int:
        """The largest forward pass's saved bytes in the step now ending."""
        return max(self.peak, self.total)

    def _push(self, torch: Any) -> None:
        autograd = torch._C._autograd
        try:
            prev = autograd._top_saved_tensors_default_hooks(True)
        except RuntimeError:
            prev = None
        if prev is not None and prev[0] is not None:
            # The job's own hooks (save_on_cpu, an offloading context) span this boundary. Ours
            # on top of theirs would be what their context pops when it ends (torch pops the
            # top), leaving theirs active for the rest of the process: no count this step.
            self.foreign_skips += 1
            return
        autograd._push_saved_tensors_default_hooks(self._pack, _unpack)
        self.pushed = True
        self._push_thread = threading.get_ident()
        self._wrap_disable(torch)
        if self._inputs is not None:
            # In the wrapper: any global hook sends every module call through torch's slow
            # call path (~4 us a call), which was most of the accounting's cost at small steps.
            self._inputs(self._on_input)
            self._inputs_set = True
        elif self._pre_handle is None:
            self._pre_handle = torch.nn.modules.module.register_module_forward_pre_hook(
                self._on_input)

    def _wrap_disable(self, torch: Any) -> None:
        """torch.func's transforms enter ``disable_saved_tensors_hooks``, which raises when any
        hooks are pushed: lift ours around it (looked up on the module at each call)."""
        graph = torch.autograd.graph
        orig = graph.disable_saved_tensors_hooks
        kept = patches.ours(orig)
        if kept is not None:
            # wrapped once per process: it serves the newest tracer's accounting (an agent
            # started again after a stop, or after `probe inject` re-attached)
            kept.state = self
            return
        record: list[patches.Patch] = []

        @contextlib.contextmanager
        def disable_saved_tensors_hooks(error_message: str) -> Iterator[None]:
            saved = record[0].state
            lifted = False
            if saved.pushed:
                saved._pop(torch)
                lifted = not saved.pushed
            try:
                with orig(error_message):
                    yield
            finally:
                # Pushed back only while counting is on: a stopped agent's accounting left on
                # the stack mid-step must not re-register its global input hook (torch.compile
                # enters this context, and found the hook, in a later job of the process).
                if lifted and saved.enabled:
                    saved._push(torch)

        record.append(patches.replace(
            graph, "disable_saved_tensors_hooks", disable_saved_tensors_hooks,
            by="tracer (saved bytes)",
            why="lifts the saved-bytes pack hook around torch.func's transforms, which refuse "
            "to run while any saved-tensor hook is pushed", restorable=False,
            why_kept="kept for the process: a stopped agent's pack hook stays pushed on the "
            "training thread until that thread's next optimizer step (only it can pop it), and "
            "torch.func must find it lifted until then; with counting off it passes through"))
        record[0].state = self

    def _pop(self, torch: Any) -> None:
        autograd = torch._C._autograd
        top = autograd._top_saved_tensors_default_hooks(True)
        # Someone pushed above ours and has not popped: leave the stack to them (popping would
        # remove theirs); our hook keeps counting until their context ends.
        if top is not None and top[0] == self._pack:
            autograd._pop_saved_tensors_default_hooks()
            self.pushed = False
        self.remove_input_hook()

    def remove_input_hook(self) -> None:
        """Any thread: module calls go back to torch's fast path."""
        h, self._pre_handle = self._pre_handle, None
        if h is not None:
            h.remove()
        if self._inputs_set:
            self._inputs_set = False
            self._inputs(None, self._on_input)

    def release(self, torch: Any) -> None:
        """Counting stops for good (the agent stops). The pack hook is on the pushing thread's
        stack, and only that thread can pop it: now, when called there; else at that thread's
        next optimizer step. Left pushed, it would cost a call per saved tensor for the rest of
        the process, and every later autograd graph (a compiled one too) would run under it."""
        self.enabled = False
        self.remove_input_hook()
        if not self.pushed or torch is None:
            return

        def pop() -> None:
            if self.pushed:
                self._pop(torch)

        optim_hooks.on_thread(sys.modules["torch.optim.optimizer"], self._push_thread, pop)

    def off(self, error: str) -> None:
        """Counting stops for good (the hook, if still pushed, only passes tensors through)."""
        self.enabled = False
        self.last_error = error

    # -- the hook (training thread, once per saved tensor) --------------------------------------
    def _count(self, t: Any) -> None:
        if not self.enabled:
            return
        try:
            s = t.untyped_storage()
            ptr = s.data_ptr()
            if not ptr or ptr in self.seen or ptr in self.skip:
                return
            self.seen.add(ptr)
            n = s.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):
            # a tensor subclass without storage (DTensor, fake): its own bytes, uncounted twice
            # only by luck; rare in a forward's saved tensors
            n = t.numel() * t.element_size()
        self.total += n
        if len(self.buf) < SV_MAX:
            self.buf.frombytes(_pack_sv(self.clock(), n, SAVED))

    def _on_input(self, module: Any, args: Any) -> None:
        """Global forward pre-hook: the bytes of this call's tensor arguments."""
        if not self.enabled or not self.pushed:
            return
        try:
            n = 0
            ptrs = []
            tensor = self.torch.Tensor
            for a in args:
                if isinstance(a, tensor):
                    s = a.untyped_storage()
                    p = s.data_ptr()
                    if p not in ptrs:
                        ptrs.append(p)
                        n += s.nbytes()
            if n and len(self.buf) < SV_MAX:
                self.buf.frombytes(_pack_sv(self.clock(), n, INPUT))
        except Exception as e:  # noqa: BLE001 - inside a module call: never raise into training
            self.failures += 1
            self.off(f"{type(e).__name__}: {e}")

    def _guarded_count(self, t: Any) -> None:
        try:
            self._count(t)
        except Exception as e:  # noqa: BLE001 - inside autograd: never raise into training
            self.failures += 1
            self.off(f"{type(e).__name__}: {e}")

    def _pack(self, t: Any) -> Any:
        self._guarded_count(t)
        return t.detach()


def _unpack(x: Any) -> Any:
    return x


def _local(t: Any) -> Any:
    """A DTensor's local shard (FSDP2), else the tensor."""
    local = getattr(t, "_local_tensor", None)
    return local if local is not None else t


def compiled_here() -> bool:
    """torch.compile has compiled frames here: AOTAutograd would trace the hook into graphs."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return False
    try:
        return bool(dynamo.utils.counters["frames"]["ok"])
    except (AttributeError, KeyError, TypeError):
        return True
