"""``discover()``: ask each adapter in turn; the first that finds its trainer answers.

Order: hf_trainer, lightning, deepspeed, accelerate (a Trainer's own Accelerator or DeepSpeed
engine must not win over the Trainer; a DeepSpeed engine knows its model, an Accelerator that
prepared it does not), then the plain loop, which always answers. Whatever an adapter leaves
out is filled by ``plain.complete`` (an optimizer stepped by hand beside the framework's).

Cost: the script's names and the frames' locals are read on every call (microseconds). Live
trainers, schedulers and DataLoaders come from one ``gc.get_objects()`` pass (about 50-100 ms
per million live objects), kept as weak references and reused while fresh: a scan is redone
when one of them died, when the optimizers stepping or in the script's names changed (a new
Trainer, a rebuilt optimizer), after ``_TTL_S``, or when the caller asks (``fresh=True``: the
actions do, once per action).
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from types import FrameType
from typing import Any

from ..heapscan import live_objects
from ..operator_code import script_namespace
from ..thread_frames import current_frames
from . import accelerate, deepspeed, hf_trainer, lightning, plain, unwrap
from .base import Context, Discovered, loaded_class

ADAPTERS = (hf_trainer, lightning, deepspeed, accelerate)
#: Seconds a gc scan is reused for. Objects created later (a second Trainer) appear after this
#: at the latest; a new optimizer stepping invalidates at once.
_TTL_S = 30.0


class _LiveCache:
    """Weak references to the live objects of each kind, from the last gc scan."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refs: dict[str, list[weakref.ref[Any]]] = {}
        self._at = -_TTL_S
        self._key: tuple[int, ...] = ()

    def get(self, key: tuple[int, ...], fresh: bool) -> dict[str, list[Any]]:
        with self._lock:
            live = self._alive()
            if fresh or live is None or key != self._key or time.monotonic() - self._at > _TTL_S:
                live = self._scan()
                self._key = key
            return live

    def _alive(self) -> dict[str, list[Any]] | None:
        out: dict[str, list[Any]] = {}
        for kind, refs in self._refs.items():
            objs = [r() for r in refs]
            if any(o is None for o in objs):
                return None  # something was freed: the job rebuilt it, scan again
            out[kind] = objs
        return out

    def _scan(self) -> dict[str, list[Any]]:
        kinds = _kinds()
        live = live_objects(kinds)
        refs: dict[str, list[weakref.ref[Any]]] = {}
        for kind, objs in live.items():
            try:
                refs[kind] = [weakref.ref(o) for o in objs]
            except TypeError:  # not weak-referenceable: never cached, rescanned next call
                refs[kind] = []
        self._refs, self._at = refs, time.monotonic()
        return live


_CACHE = _LiveCache()


def _kinds() -> dict[str, tuple[type, ...]]:
    """The types to collect, among modules the program already imported."""
    kinds: dict[str, tuple[type, ...]] = {"scheduler": unwrap.scheduler_types()}
    data = sys.modules.get("torch.utils.data")
    kinds["loader"] = (data.DataLoader,) if data is not None else ()
    trainers = [loaded_class(q) for a in ADAPTERS for q in a.trainer_classes]
    kinds["trainer"] = tuple(t for t in trainers if t is not None)
    return kinds


def main_frame() -> FrameType | None:
    return current_frames().get(threading.main_thread().ident or -1)


def discover(frame: FrameType | None = None, optimizers: list[Any] | None = None,
             fresh: bool = False, frame_locals: bool = True) -> Discovered:
    """The job's trainer, models, optimizers, schedulers and train loader.

    Args:
        frame: the training thread's innermost frame; default: the main thread's. Its frames'
            locals are where framework loops keep their trainer (``self``).
        optimizers: those the step clock saw stepping (``StepClock.optimizers()``); none
            given: only what the script's names and the live objects show.
        fresh: rescan live objects now instead of reusing the last scan.
        frame_locals: read the frames' locals. Off for reads the agent makes by itself: on
            Python < 3.13 ``f_locals`` of a function frame is a snapshot the frame keeps, so
            an object the script later ``del``s (a model, a big tensor) stays alive until
            that frame returns or its locals are read again.
    """
    frame = frame if frame is not None else main_frame()
    stepping = list(optimizers or ())
    frames = []
    f = frame if frame_locals else None
    while f is not None:
        frames.append(f.f_locals)
        f = f.f_back
    namespace = script_namespace(frame if frame_locals else None)
    live = _CACHE.get(_key(stepping, namespace), fresh)
    ctx = Context(namespace=namespace, frame_locals=frames, stepping=stepping,
                  live=lambda kind: live.get(kind, []))
    found = None
    for adapter in ADAPTERS:
        found = adapter.find(ctx)
        if found is not None:
            break
    d = plain.complete(found, ctx) if found is not None else plain.find(ctx)
    if not d.wrapped_models:
        d.wrapped_models = list(d.models)
    _primary_first(d, stepping)
    return d


def _key(stepping: list[Any], namespace: dict[str, Any]) -> tuple[int, ...]:
    """What makes a cached scan stale: other optimizers stepping, or other optimizers in the
    script's names (a job that rebuilt its optimizer and scheduler)."""
    optim = sys.modules.get("torch.optim")
    own = getattr(namespace, "own", namespace)  # not a framework's frame locals: they come and go
    named = ([id(v) for k, v in namespace.items() if k in own and isinstance(v, optim.Optimizer)]
             if optim is not None else [])
    return (*(id(o) for o in stepping), -1, *named)


def _primary_first(d: Discovered, stepping: list[Any]) -> None:
    """Optimizers that step first, in the clock's order (the primary one defines the step)."""
    order = {id(o): i for i, o in enumerate(stepping)}
    d.optimizers.sort(key=lambda o: order.get(id(o), len(order)))
