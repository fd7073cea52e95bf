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
    return (f"probe refused: torch.distributed.{op} from an immediate eval would run on this "
            "rank alone, mid-step, while the other ranks run their own collectives; they would "
            "fall out of step and the job would abort. Run it at a step boundary on every rank "
            "instead: probe eval --next-step '...' (nothing was sent to the other ranks)")


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
        code = frame.f_code
        if code.co_name in self._ops and code.co_filename.endswith(_C10D_FILE) \
                and _world_size() > 1:
            raise CollectiveInEvalError(refusal(code.co_name))
        return None

    def _on_line(self, frame: FrameType, event: str, arg: Any) -> Any:
        # Only on 'line': a raise on 'call' or 'return' lands inside whatever try called it.
        if self.active and self.cancelled is not None and event == "line":
            raise EvalCancelled(self.cancelled)
        return self._on_line

    def _on_profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.active and self.cancelled is not None and sys.gettrace() is None:
            sys.settrace(self._on_call)  # a raise above unset it (CPython's rule)
            self._trace_lines(frame)

    def _trace_lines(self, frame: FrameType | None) -> None:
        """Line tracing on ``frame`` and its callers up to the eval's own code (the agent's
        frames and the thread's start-up are left alone); nothing when the eval's code is not
        on the stack (it has not started, or has ended)."""
        chain = []
        while frame is not None:
            chain.append(frame)
            if frame.f_code.co_filename == FILENAME and (
                    frame.f_back is None or frame.f_back.f_code.co_filename != FILENAME):
                for f in chain:
                    f.f_trace = self._on_line
                    f.f_trace_lines = True
                return
            frame = frame.f_back

    # -- any thread ---------------------------------------------------------------------------
    def cancel(self, why: str, thread_id: int | None) -> None:
        """Make every further line of the eval thread raise ``EvalCancelled(why)``."""
        self.cancelled = why
        frame = current_frames().get(thread_id) if thread_id is not None else None
        if self.active and frame is not None:
            self._trace_lines(frame)
