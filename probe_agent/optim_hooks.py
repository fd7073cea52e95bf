"""Global optimizer step hooks added and removed without disturbing a step in progress.

torch runs a step's global hooks by iterating ``_global_optimizer_{pre,post}_hooks.values()``
lazily (``itertools.chain`` in ``Optimizer.step``'s wrapper): a hook added or removed from another
thread while the training thread is between two hooks of that loop raises ``RuntimeError:
OrderedDict mutated during iteration`` in the training thread. Seen: ``probe_agent.stop()`` run
from an eval killed the training loop of an injected process. So the agent never changes those
dicts in place: it copies, changes the copy, and rebinds the module's name. A loop in progress
keeps iterating the old dict; the next step reads the new one.

Caveat: a ``RemovableHandle`` that someone else took for a global optimizer hook before one of
these swaps points at the old dict, so its ``remove()`` no longer reaches the hook. In torch and
the frameworks we test, only ``torch.distributed._tools.mem_tracker`` removes such hooks.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from . import patches

_lock = threading.Lock()


class GlobalHook:
    """One hook in ``torch.optim.optimizer._global_optimizer_{kind}_hooks``; ``remove()`` is
    idempotent and safe from any thread."""

    def __init__(self, module: Any, name: str, key: int, record: patches.Setting) -> None:
        self._module, self._name, self._key = module, name, key
        self._record = record

    def remove(self) -> None:
        self._record.done()
        with _lock:
            old = getattr(self._module, self._name)
            if self._key in old:
                new = OrderedDict(old)
                del new[self._key]
                setattr(self._module, self._name, new)


def register(module: Any, kind: str, hook: Any) -> GlobalHook:
    """Add ``hook`` as a global optimizer ``kind`` ('pre' or 'post') step hook of ``module``
    (``torch.optim.optimizer``), copy-on-write."""
    name = f"_global_optimizer_{kind}_hooks"
    with _lock:
        new = OrderedDict(getattr(module, name))
        key = module.hooks.RemovableHandle(new).id  # torch's own id counter: no clash
        new[key] = hook
        setattr(module, name, new)
    # In the patch ledger (patches.py): `probe info` lists the hook while it is there.
    record = patches.setting(
        f"torch.optim.optimizer.{name}[{key}]", getattr(hook, "__qualname__", repr(hook)),
        by="optimizer hooks", why="a global optimizer step hook, the dict rebound copy-on-write")
    return GlobalHook(module, name, key, record)


def on_thread(module: Any, thread: int | None, fn: Any) -> None:
    """Run ``fn()`` on the thread ``thread`` (a ``threading.get_ident()``): now when called
    there, else once, right after that thread's next optimizer step (global post hook on
    ``module``, ``torch.optim.optimizer``). For state only that thread can undo (its saved-tensor
    hook stack, its dispatch mode stack) when the agent stops from another thread. A thread
    that has ended took that state with it: the hook then drops itself without calling ``fn``."""
    if thread is None or threading.get_ident() == thread:
        fn()
        return
    handle: list[GlobalHook] = []

    def once(*_: Any) -> None:
        if threading.get_ident() != thread:
            if not any(t.ident == thread for t in threading.enumerate()):
                handle[0].remove()
            return
        handle[0].remove()
        fn()

    handle.append(register(module, "post", once))
