"""Live objects of some types, found with the garbage collector, safely from any thread.

``gc.get_objects()`` returns a list holding a reference to every object the collector tracks,
including a tuple that another thread is still building: CPython grows such a tuple in place
only while it holds the sole reference (``_PyTuple_Resize``), so a thread that resumes while the
list is alive dies with ``SystemError: Objects/tupleobject.c: bad argument to internal function``.
Seen: rank 1 of the demo job failed inside ``import torch._dynamo`` (a ``tuple(generator)``)
while an eval from the CLI discovered the script's objects on another thread.

So the list never outlives a turn of the GIL: while it exists, the interpreter's switch interval
is raised so that no other thread is asked to run, nothing done with it releases the GIL (type
checks only), and only the objects asked for (modules, tensors, optimizers, never tuples) are
kept. Before that, one short sleep lets threads that began waiting under the old interval wait
again under the new one (a waiter's timeout is read when it starts waiting). Scans are
serialised: the interval is process-wide.

The hold is the training thread's stall, so it is kept short: the objects are picked in C
(``itertools.compress`` over ``map(type, ...)`` and a dict of the types seen), not by a Python
loop over each of them: on a heap of a million objects that cut the hold by about a third
(bench/bench_heap_census.py); ``gc.get_objects()`` itself is the rest, and cannot be split.
While it holds the GIL, the agent's watchdog is told that the rank is busy on purpose
(``busy_hook``: its heartbeat says so), so a request that arrives meanwhile waits for the answer
instead of getting a 504 "GIL held".
"""

from __future__ import annotations

import gc
import itertools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import patches

_lock = threading.Lock()
#: Seconds: long enough that no thread is preempted while a scan holds the list.
_HOLD_S = 60.0
#: In the patch ledger (patches.py): `probe info` shows how many heap walks held the others.
_WINDOW = patches.window("sys.setswitchinterval", f"{_HOLD_S} s during a heap walk",
                         by="heap scan", why="no other thread runs while gc.get_objects()'s "
                         "list exists (a tuple another thread still builds must not be seen)")
#: How long the watchdog is told the rank may not run Python during one walk (a million
#: objects take 0.2-1.5 s here); past it, the watchdog judges the heartbeat as usual.
BUSY_S = 10.0
#: Set by the agent's watchdog link: called with BUSY_S before a walk and 0 after it.
busy_hook: Callable[[float], None] | None = None


def live_objects(groups: dict[str, tuple[type, ...]]) -> dict[str, list[Any]]:
    """For each group, the live objects whose type subclasses one of its types.

    ``type()``, not ``isinstance()``: isinstance falls back to ``__class__``, a property some
    objects compute (``torch.distributed.reduce_op`` warns when it is read). An object can be
    in several groups. Costs one heap walk (0.1-0.5 s for a million objects on these cores)
    during which other threads of the process wait.
    """
    every = tuple(t for types in groups.values() for t in types)
    if tuple in every or any(issubclass(tuple, t) for t in every if t is not object):
        raise ValueError("heapscan keeps no tuples: a tuple may be one another thread builds")
    out: dict[str, list[Any]] = {k: [] for k in groups}
    if not every:
        return out
    with _lock:
        _WINDOW.uses += 1
        hook = busy_hook
        old = sys.getswitchinterval()
        if hook is not None:
            hook(BUSY_S)
        sys.setswitchinterval(_HOLD_S)
        try:
            time.sleep(2 * old + 0.001)
            picked = _walk(every)
        finally:
            sys.setswitchinterval(old)
            if hook is not None:
                hook(0.0)
    for o in picked:  # no tuples among them: the GIL may change hands from here on
        t = type(o)
        for name, types in groups.items():
            if issubclass(t, types):
                out[name].append(o)
    return out


def _walk(every: tuple[type, ...]) -> list[Any]:
    """The live objects whose type subclasses one of ``every``, picked in C. The heap's list
    lives only in this frame: it is gone when the frame returns, before the switch interval is
    lowered again."""
    objs = gc.get_objects()
    return list(itertools.compress(objs, map(_Wanted(every).__getitem__, map(type, objs))))


class _Wanted(dict[type, bool]):
    """type -> whether it subclasses one of ``every``: a C dict lookup per object, Python only
    the first time a type is seen (a few thousand types against a million objects)."""

    def __init__(self, every: tuple[type, ...]) -> None:
        super().__init__()
        self.every = every

    def __missing__(self, t: type) -> bool:
        found = self[t] = issubclass(t, self.every)
        return found
