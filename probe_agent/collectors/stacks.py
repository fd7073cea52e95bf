"""Python stacks of every thread, from ``sys._current_frames()`` (stdlib only).

Used by ``/v1/backtrace`` and to materialise ``python.backtrace`` (the training thread: the
one that steps the optimizer, else the main thread) and ``python.backtrace_all`` (every thread
but the agent's). Locals are rendered as safe, truncated reprs: a ``__repr__`` that raises or
is slow-to-print is contained, and tensors are summarised from their metadata (printing a CUDA
tensor would synchronise the device).

The agent's own frames (the tracer's ``native_call`` around every module call, the step
clock's and the DataLoader wrappers) are left out of the user's threads: they are not the
user's code and only push it down the stack. ``depth`` counts the frames that are shown.
"""

from __future__ import annotations

import json
import os
import reprlib
import threading
from dataclasses import asdict, dataclass, field
from types import FrameType
from typing import Any

from ..redact import redact_locals
from ..thread_frames import current_frames
from .registry import CollectorSpec

AGENT_THREAD_PREFIX = "probe-agent"
#: Every name the agent gives its own threads. The C++ hot path's builder is not "probe-agent.*"
#: because it may outlive the agent that started it (one build per machine); it is the agent's
#: all the same, and not the user's (`probe backtrace` listed it with is_agent false).
AGENT_THREAD_PREFIXES = (AGENT_THREAD_PREFIX, "probe-native-build")


def is_agent_thread(name: str) -> bool:
    return name.startswith(AGENT_THREAD_PREFIXES)
#: Files of the agent itself (this package), whose frames are hidden from the user's threads.
AGENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_MAX_FRAMES = 256
_REPR = reprlib.Repr()
_REPR.maxstring = 120
_REPR.maxother = 120
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8
_REPR.maxlevel = 2


@dataclass(slots=True)
class Frame:
    depth: int
    func: str
    file: str
    lineno: int
    frame_type: str = "Python"
    locals: dict[str, str] | None = None


@dataclass(slots=True)
class ThreadStack:
    thread_id: int
    thread_name: str
    is_main: bool
    is_agent: bool
    frames: list[Frame] = field(default_factory=list)


def safe_repr(value: Any, limit: int = 200) -> str:
    """repr() that never raises and never prints tensor data."""
    try:
        cls = type(value)
        if cls.__name__ in ("Tensor", "Parameter") and hasattr(value, "shape"):
            return (
                f"{cls.__name__}(shape={list(value.shape)}, dtype={value.dtype}, "
                f"device={value.device})"
            )
        text = _REPR.repr(value)
    except Exception as e:  # user __repr__ may do anything; the backtrace must still answer
        text = f"<repr failed: {type(e).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_agent_file(path: str) -> bool:
    """Whether a frame's file is the agent's own: this install's, any ``probe_agent/``
    package (the watchdog reads another process's paths), or the tracer's C++ extension
    (``probe_trace_native_*.so``, in native stacks)."""
    return (path.startswith(AGENT_DIR) or f"{os.sep}probe_agent{os.sep}" in path
            or "probe_trace_native_" in path)


def hide_agent_frames(thread: dict[str, Any]) -> dict[str, Any]:
    """A thread of a stack answer (``/v1/backtrace``'s shape) without the agent's frames, its
    depths counted again; an agent thread is left whole. In place; returns ``thread``."""
    if thread.get("is_agent"):
        return thread
    kept = [f for f in thread.get("frames") or [] if not is_agent_file(str(f.get("file") or ""))]
    for i, f in enumerate(kept):
        f["depth"] = i
    thread["frames"] = kept
    return thread


def _frames(frame: FrameType | None, with_locals: bool, show_secrets: bool = False,
            hide_agent: bool = True) -> list[Frame]:
    out: list[Frame] = []
    while frame is not None and len(out) < _MAX_FRAMES:
        if not isinstance(frame, FrameType):
            # Seen under load on CPython 3.11: walking f_back of another running thread's
            # frame returned a builtin function (the frame was being torn down). Stop there
            # rather than answer HTTP 500.
            out.append(Frame(len(out), "<frame changed while read>", "", 0, "Python", None))
            break
        code = frame.f_code
        if hide_agent and code.co_filename.startswith(AGENT_DIR):
            frame = frame.f_back
            continue
        loc = None
        if with_locals:
            loc = redact_locals({k: safe_repr(v) for k, v in list(frame.f_locals.items())[:64]},
                                show_secrets)
        out.append(
            Frame(len(out), code.co_name, code.co_filename, frame.f_lineno or 0, "Python", loc))
        frame = frame.f_back
    return out


def snapshot(*, with_locals: bool = False, include_agent: bool = False,
             show_secrets: bool = False) -> list[ThreadStack]:
    """Stacks of every live thread, main thread first, innermost frame first. Locals whose
    names look like secrets are redacted unless ``show_secrets``."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main_id = threading.main_thread().ident
    me = threading.get_ident()
    stacks = []
    for tid, frame in current_frames().items():
        name = names.get(tid, f"Thread-{tid}")
        is_agent = is_agent_thread(name) or tid == me
        if is_agent and not include_agent:
            continue
        stacks.append(ThreadStack(tid, name, tid == main_id, is_agent,
                                  _frames(frame, with_locals, show_secrets, not is_agent)))
    stacks.sort(key=lambda s: (not s.is_main, s.is_agent, s.thread_name))
    return stacks


def to_dicts(stacks: list[ThreadStack]) -> list[dict[str, Any]]:
    return [asdict(s) for s in stacks]


def to_columns(stacks: list[ThreadStack], rank: int) -> dict[str, list[Any]]:
    """Column lists in python.backtrace order, ready for ``pyarrow.table``."""
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "rank", "thread_id", "thread_name", "is_main", "depth",
            "func", "file", "lineno", "frame_type", "locals",
        )
    }
    for s in stacks:
        for f in s.frames:
            cols["rank"].append(rank)
            cols["thread_id"].append(s.thread_id)
            cols["thread_name"].append(s.thread_name)
            cols["is_main"].append(s.is_main)
            cols["depth"].append(f.depth)
            cols["func"].append(f.func)
            cols["file"].append(f.file)
            cols["lineno"].append(f.lineno)
            cols["frame_type"].append(f.frame_type)
            cols["locals"].append(json.dumps(f.locals) if f.locals is not None else None)
    return cols


def training_stack(stacks: list[ThreadStack], training_thread: int | None) -> list[ThreadStack]:
    """The training thread's stack: ``training_thread`` (the one that steps the optimizer)
    while it lives, else the main thread, else the first thread that is not the agent's."""
    users = [s for s in stacks if not s.is_agent]
    for pick in (lambda s: s.thread_id == training_thread, lambda s: s.is_main, lambda s: True):
        hit = next((s for s in users if pick(s)), None)
        if hit is not None:
            return [hit]
    return []


class BacktraceTables:
    """Materialises ``python.backtrace`` (the training thread) and ``python.backtrace_all``
    (every thread but the agent's) when a query names them; a collector in the registry's
    sense (``start(sink)``, ``stop()``), though nothing is recorded between queries."""

    def __init__(self, clock: Any, rank: int) -> None:
        self.clock = clock  # the step clock: training_thread is the thread that steps
        self.rank = rank

    def start(self, sink: Any) -> None:
        import pyarrow as pa

        def training() -> Any:
            picked = training_stack(snapshot(), getattr(self.clock, "training_thread", None))
            return pa.table(to_columns(picked, self.rank),
                            schema=sink.arrow_schema("python.backtrace"))

        def every() -> Any:
            return pa.table(to_columns(snapshot(), self.rank),
                            schema=sink.arrow_schema("python.backtrace_all"))

        sink.add_materializer("python.backtrace", training)
        sink.add_materializer("python.backtrace_all", every)

    def stop(self) -> None:
        pass


#: This collector, for the registry (registry.py).
COLLECTOR = CollectorSpec("stacks", 90, lambda b: BacktraceTables(b.clock, b.rank),
                          tables=("python.backtrace", "python.backtrace_all"))
