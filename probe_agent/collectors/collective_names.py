"""What a collective is called and where the user asked for it, for ``python.collectives``
(collectives.py): one op name per collective whichever API or backend ran it, and the innermost
frame outside torch, DeepSpeed and the decorators between them. Stdlib only; reads modules the
program imported, never imports them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: Modules whose frames are never where the user asked for a collective: torch, DeepSpeed's
#: comm layer, the decorators between them (``typing_extensions.deprecated``'s wrapper sits
#: above every ``reduce_scatter_tensor`` and ``all_gather_into_tensor`` in torch 2.13), and
#: this recorder. Packages by their directory, single files by their path (never by a name in
#: the path: a user's project may well live in a directory called ``deepspeed``).
_NOT_USER_PACKAGES = ("torch", "deepspeed")
_NOT_USER_FILES = ("typing_extensions", "functools", "contextlib")
_internal: tuple[tuple[str, ...], frozenset[str], int] = ((), frozenset(), -1)
#: One name per collective, whichever API asked for it (the Flight Recorder says
#: ``all_gather`` for ``all_gather_into_tensor``; the wrappers see the API's name).
OP_NAMES = {"reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
            "all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather"}


def not_user() -> tuple[tuple[str, ...], frozenset[str]]:
    """(directory prefixes, file paths) of ``_NOT_USER_*``, recomputed when one more of them
    has been imported (DeepSpeed after torch)."""
    global _internal
    loaded = [sys.modules.get(n) for n in (*_NOT_USER_PACKAGES, *_NOT_USER_FILES)]
    count = sum(m is not None for m in loaded)
    if count != _internal[2]:
        files = [getattr(m, "__file__", None) for m in loaded]
        n = len(_NOT_USER_PACKAGES)
        dirs = [os.path.dirname(f) + os.sep for f in files[:n] if f]
        dirs.append(os.path.dirname(os.path.abspath(__file__)) + os.sep)
        _internal = (tuple(dirs), frozenset(f for f in files[n:] if f), count)
    return _internal[0], _internal[1]


def user_frame(frame: Any) -> Any:
    """The innermost frame at or above ``frame`` outside torch, DeepSpeed and decorators (the
    first one when every frame is: a collective torch runs on its own)."""
    dirs, files = not_user()
    f = frame
    for _ in range(64):
        if f is None:
            break
        name = f.f_code.co_filename
        if not (name.startswith(dirs) or name in files):
            return f
        f = f.f_back
    return frame


def fr_op(e: dict[str, Any]) -> str:
    """The collective a Flight Recorder entry records. gloo runs ``reduce_scatter_tensor`` as
    an all-reduce and records it as ``all_reduce``; the entry's own stack still names the API
    (``reduce_scatter_tensor`` in distributed_c10d.py), and that is what every rank asked for."""
    op = str(e.get("profiling_name", "")).split(":", 1)[-1]
    if op != "all_reduce":
        return OP_NAMES.get(op, op)
    for f in e.get("frames") or ():
        if f.get("filename", "").endswith("distributed_c10d.py") and (
                f.get("name", "").lstrip("_").startswith("reduce_scatter")):
            return "reduce_scatter"
    return op


def callsite(frames: Any) -> str | None:
    """The innermost frame outside torch, DeepSpeed and decorators: where the user's code
    asked for it."""
    dirs, files = not_user()
    for f in frames:
        name = f.get("filename", "")
        if not (name.startswith(dirs) or name in files):
            return f"{f['filename']}:{f['line']} {f['name']}"
    return None
