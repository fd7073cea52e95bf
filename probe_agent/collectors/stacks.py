"""Python stacks of every thread, from ``sys._current_frames()`` (stdlib only).

Used by ``/v1/backtrace`` and to materialise ``python.backtrace``. Locals are rendered as
safe, truncated reprs: a ``__repr__`` that raises or is slow-to-print is contained, and tensors
are summarised from their metadata (printing a CUDA tensor would synchronise the device).
"""

from __future__ import annotations

import json
import reprlib
import sys
import threading
from dataclasses import asdict, dataclass, field
from types import FrameType
from typing import Any

from ..access import redact_locals

AGENT_THREAD_PREFIX = "probe-agent"
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


def _frames(frame: FrameType | None, with_locals: bool, show_secrets: bool = False) -> list[Frame]:
    out: list[Frame] = []
    while frame is not None and len(out) < _MAX_FRAMES:
        if not isinstance(frame, FrameType):
            # Seen under load on CPython 3.11: walking f_back of another running thread's
            # frame returned a builtin function (the frame was being torn down). Stop there
            # rather than answer HTTP 500.
            out.append(Frame(len(out), "<frame changed while read>", "", 0, "Python", None))
            break
        code = frame.f_code
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
    names look like secrets are redacted unless ``show_secrets`` (issue 19)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main_id = threading.main_thread().ident
    me = threading.get_ident()
    stacks = []
    for tid, frame in sys._current_frames().items():
        name = names.get(tid, f"Thread-{tid}")
        is_agent = name.startswith(AGENT_THREAD_PREFIX) or tid == me
        if is_agent and not include_agent:
            continue
        stacks.append(ThreadStack(tid, name, tid == main_id, is_agent,
                                  _frames(frame, with_locals, show_secrets)))
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
