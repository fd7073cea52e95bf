"""The trace an immediate eval's thread runs under: no collectives, and a cancel that sticks.

``probe eval`` (without ``--next-step``) runs on an agent thread while the training thread goes
on. Two things it must not do to the job, each enforced here, on that thread only (the job's
threads are never traced):

- **Call a collective.** ``dist.all_reduce(t)`` from an eval runs on this rank alone, mid-step,
  while the other ranks run their own collectives: the ranks' sequence numbers no longer match,
  gloo aborted rank 1 (SIGABRT) and torchrun tore the DDP job down. A call of any public
  ``torch.distributed`` collective (collectors/collectives.py ``WRAPPED``) in a job of more
  than one rank raises ``CollectiveInEvalError`` before it starts, with the ``--next-step``
  form to use instead: at a step boundary every rank runs it, so the collectives match.
  The process group's own methods (``pg.allreduce([t]).wait()``) and DDP's C++ collectives
  (the reducer arming its gradient all-reduce, the buffer broadcast before a forward) never
  pass through those Python functions: the profile function sees them as C calls
  (``c_call``, the bound method) and refuses them too, whatever Python name reached them.
- **Outlive a cancel.** An asynchronous exception (the evaluator's timeout) is raised once, at
  whatever line the thread is on; ``while True: try: ... except: pass`` catches it and goes on
  (it ran until the job ended, the median step 68 -> 130-150 ms). After a cancel, every line
  the thread runs raises ``EvalCancelled``: a line outside the ``try`` comes within one turn
  of any loop, and the exception leaves. CPython unsets a trace function that raised, so a
  profile function (which sees every call, C calls included) sets it again.

Cost: one Python call per function call of the eval's own thread (``sys.settrace`` 'call'
events; line events only after a cancel). Evals are ad hoc; training threads pay nothing.
Code blocked inside one C call (``time.sleep(600)``) stops only when that call returns.
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any

from .operator_code import FILENAME
from .thread_frames import current_frames

_C10D_FILE = os.path.join("torch", "distributed", "distributed_c10d.py")


class EvalCancelled(BaseException):
    """Raised on every line of an eval thread once its eval was cancelled (or timed out)."""


class CollectiveInEvalError(RuntimeError):
    """An immediate eval called a torch.distributed collective in a multi-rank job."""


def _collectives() -> frozenset[str]:
    from .collectors.collectives import WRAPPED

    return frozenset(WRAPPED)


def refusal(op: str) -> str:
    where = op if "." in op or " " in op else f"torch.distributed.{op}"
    return (f"probe refused: {where} from an immediate eval would run on this "
            "rank alone, mid-step, while the other ranks run their own collectives; they would "
            "fall out of step and the job would abort. Run it at a step boundary on every rank "
            "instead: probe eval --next-step '...' (nothing was sent to the other ranks)")


#: C methods that start a collective, by the class (torch._C._distributed_c10d) they are bound
#: to: every communicating method of a ProcessGroup and of its backends, and the DDP reducer's
#: calls that arm the gradient all-reduce or broadcast bucket indices.
_PG_METHODS = frozenset({
    "allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "_allgather_base",
    "allgather_coalesced", "allgather_into_tensor_coalesced", "all_gather_single",
    "all_gather_single_coalesced", "gather", "scatter", "reduce_scatter", "_reduce_scatter_base",
    "reduce_scatter_single", "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base", "all_to_all_single",
    "barrier", "monitored_barrier", "send", "recv", "recv_anysource"})
_REDUCER_METHODS = frozenset({"prepare_for_backward", "_rebuild_buckets",
                              "_push_all_rebuilt_params"})
#: Module-level C functions of torch._C._distributed_c10d that run a collective.
_C10D_FUNCTIONS = frozenset({"_broadcast_coalesced", "_verify_params_across_processes"})


_c_ids: dict[int, str] = {}
_c_module: Any = None


def _collective_c_functions() -> dict[int, str]:
    """id of each C function that starts a collective -> what to call it. pybind11 hands the
    profile function the method's function object, not the instance it is bound to, so the
    methods are known by identity: every class of torch._C._distributed_c10d that is a
    ProcessGroup, a Backend (gloo, NCCL, the wrappers) or DDP's Reducer."""
    global _c_ids, _c_module
    c10d = sys.modules.get("torch._C._distributed_c10d")
    if c10d is None or c10d is _c_module:
        return _c_ids
    ids: dict[int, str] = {}
    bases = tuple(k for k in (getattr(c10d, "ProcessGroup", None), getattr(c10d, "Backend", None))
                  if isinstance(k, type))
    reducer = getattr(c10d, "Reducer", None)
    for cls in list(vars(c10d).values()):
        if not isinstance(cls, type):
            continue
        if bases and issubclass(cls, bases):
            names, label = _PG_METHODS, "ProcessGroup.{}"
        elif cls is reducer:
            names, label = _REDUCER_METHODS, "DDP's reducer ({}: its gradient all-reduce)"
        else:
            continue
        for name in names:
            for klass in cls.__mro__:
                fn = klass.__dict__.get(name)
                if fn is not None:
                    ids[id(getattr(fn, "__func__", fn))] = label.format(name)
    for name in _C10D_FUNCTIONS:
        fn = getattr(c10d, name, None)
        if fn is not None:
            ids[id(fn)] = f"torch.distributed.{name} (DDP's buffer and parameter broadcast)"
    _c_ids, _c_module = ids, c10d
    return ids


def _c_collective(fn: Any) -> str | None:
    """The name of the collective a C call starts, or None."""
    ids = _c_ids if _c_module is not None else _collective_c_functions()
    return ids.get(id(fn))


def _world_size() -> int:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_initialized():
            return 1
        return int(dist.get_world_size())
    except Exception:  # an odd backend state: do not guess that it is safe... nor refuse
        return 1


class EvalTrace:
    """Installed by the eval thread itself (``install``), removed as the eval ends
    (``remove``); ``cancel`` is called from any thread."""

    def __init__(self) -> None:
        self.cancelled: str | None = None
        self.active = False
        self._ops = _collectives()

    # -- the eval thread ----------------------------------------------------------------------
    def install(self) -> None:
        self.active = True
        sys.settrace(self._on_call)
        sys.setprofile(self._on_profile)

    def remove(self) -> None:
        self.active = False
        sys.setprofile(None)
        sys.settrace(None)

    def _on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not self.active:
            return None
        if self.cancelled is not None:
            return self._on_line  # trace the new frame's lines: it may be the loop
        if sys.getprofile() is None:
            sys.setprofile(self._on_profile)  # a refusal raised there unset it (CPython's rule)
        code = frame.f_code
        if code.co_name in self._ops and code.co_filename.endswith(_C10D_FILE) \
                and _world_size() > 1:
            raise CollectiveInEvalError(refusal(code.co_name))
        return None

    def _on_refused_line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self.active and sys.getprofile() is None:
            sys.setprofile(self._on_profile)
        if self.cancelled is not None:
            return self._on_line(frame, event, arg)
        return self._on_refused_line

    def _on_line(self, frame: FrameType, event: str, arg: Any) -> Any:
        # Only on 'line': a raise on 'call' or 'return' lands inside whatever try called it.
        if self.active and self.cancelled is not None and event == "line":
            raise EvalCancelled(self.cancelled)
        return self._on_line

    def _on_profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and self.active:
            op = _c_collective(arg)
            if op is not None and _world_size() > 1:
                # Raised here, the C function is never called (CPython returns the error to
                # the caller instead), and the profile function is unset: the next line of
                # the frames up to the eval's code, or the next Python call (_on_call), sets
                # it again, so an eval that catches the refusal is refused again.
                self._watch_lines(frame, self._on_refused_line)
                raise CollectiveInEvalError(refusal(op))
        if self.active and self.cancelled is not None and sys.gettrace() is None:
            sys.settrace(self._on_call)  # a raise above unset it (CPython's rule)
            self._trace_lines(frame)

    def _trace_lines(self, frame: FrameType | None) -> None:
        """Line tracing on ``frame`` and its callers up to the eval's own code (the agent's
        frames and the thread's start-up are left alone); nothing when the eval's code is not
        on the stack (it has not started, or has ended)."""
        self._watch_lines(frame, self._on_line, alone=False)

    def _watch_lines(self, frame: FrameType | None, fn: Any, alone: bool = True) -> None:
        """``fn`` traces the lines of ``frame`` and its callers up to the eval's own code;
        when that code is not on the stack, of ``frame`` alone (``alone``) or of none."""
        chain = []
        top = frame
        while frame is not None:
            chain.append(frame)
            if frame.f_code.co_filename == FILENAME and (
                    frame.f_back is None or frame.f_back.f_code.co_filename != FILENAME):
                break
            frame = frame.f_back
        else:
            chain = [top] if alone and top is not None else []
        for f in chain:
            f.f_trace = fn
            f.f_trace_lines = True

    # -- any thread ---------------------------------------------------------------------------
    def cancel(self, why: str, thread_id: int | None) -> None:
        """Make every further line of the eval thread raise ``EvalCancelled(why)``."""
        self.cancelled = why
        frame = current_frames().get(thread_id) if thread_id is not None else None
        if self.active and frame is not None:
            self._trace_lines(frame)
