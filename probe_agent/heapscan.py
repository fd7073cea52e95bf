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
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from typing import Any

from . import patches

_lock = threading.Lock()
#: Seconds: long enough that no thread is preempted while a scan holds the list.
_HOLD_S = 60.0
#: In the patch ledger (patches.py): `probe info` shows how many heap walks held the others.
_WINDOW = patches.window("sys.setswitchinterval", f"{_HOLD_S} s during a heap walk",
                         by="heap scan", why="no other thread runs while gc.get_objects()'s "
                         "list exists (a tuple another thread still builds must not be seen)")


def live_objects(groups: dict[str, tuple[type, ...]]) -> dict[str, list[Any]]:
    """For each group, the live objects whose type subclasses one of its types.

    ``type()``, not ``isinstance()``: isinstance falls back to ``__class__``, a property some
    objects compute (``torch.distributed.reduce_op`` warns when it is read). An object can be
    in several groups. Costs one heap walk (about 50-100 ms on a large job) during which other
    threads of the process wait.
    """
    every = tuple(t for types in groups.values() for t in types)
    if tuple in every or any(issubclass(tuple, t) for t in every if t is not object):
        raise ValueError("heapscan keeps no tuples: a tuple may be one another thread builds")
    out: dict[str, list[Any]] = {k: [] for k in groups}
    if not every:
        return out
    with _lock:
        _WINDOW.uses += 1
        old = sys.getswitchinterval()
        sys.setswitchinterval(_HOLD_S)
        try:
            time.sleep(2 * old + 0.001)
            _walk(groups, every, out)
        finally:
            sys.setswitchinterval(old)
    return out


def _walk(groups: dict[str, tuple[type, ...]], every: tuple[type, ...],
          out: dict[str, list[Any]]) -> None:
    # The list lives only in this frame: it is gone when the frame returns, before the switch
    # interval is lowered again.
    for o in gc.get_objects():
        t = type(o)
        if not issubclass(t, every):
            continue
        for name, types in groups.items():
            if issubclass(t, types):
                out[name].append(o)
