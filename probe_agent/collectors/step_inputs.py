"""What one training step was given, kept until the step ends: the root model's calls (each
micro-batch's arguments and autocast state) and the DataLoader sample indices of each batch.
The NaN hunt re-runs those calls (nan_hunt.py); the anomaly rows name those samples.

The root model is the tracer's; when no tracer names it (PROBE_TRACE=off), one heap walk after
the first step lists the modules that hold the stepping optimizers' parameters (heapscan.py:
~50-100 ms, on the writer thread, once), and the training thread picks at the next step
boundary the largest of them whose trainable parameters all belong to the optimizers and
that holds every trainable parameter of one of them. A forward pre-hook on it keeps the calls:
one list append per micro-batch, only while grad is enabled (an eval forward is not the step's).

Why the pick waits for a step boundary: FSDP2 swaps a module's registered parameters between
the sharded DTensors the optimizer steps and unsharded tensors while it runs the module's
forward and backward. A walk that judged the modules then (the writer thread runs beside the
training thread) found the model's own parameters "not the optimizer's" and took a block, or
the ModuleList of blocks, for the model on one rank: its re-run of a NaN step then named
modules relative to that block ('mlp.fc1'), and, with the other rank re-running the whole
model, the ranks' all-gathers no longer matched (garbage weights: "produced in 'mlp.fc1' by
linear" on the rank that had only received the NaN). At the boundary every module holds its
shards; a candidate that holds only a part of an optimizer's parameters is never the model.

Sample indices: ``_BaseDataLoaderIter._next_index`` is wrapped to keep the indices of each batch
the sampler hands out, in order, on the iterator (a worker pool asks ahead; batches come back in
that order); the loop monitor's ``__next__`` wrapper pops them as batches are taken
(``on_batch``).
"""

from __future__ import annotations

import collections
import functools
import time
from typing import Any

from .. import patches
from .module_stats import ModuleMap, unwrap
from .torch_import import imported

#: Root calls (micro-batches) of one step kept for a re-run.
MAX_CALLS = 64
#: Modules a heap walk offers as the model, largest first.
MAX_CANDIDATES = 8


class StepInputs:
    """The current step's root calls and batch indices (training thread), and the root model."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any, Any]] = []
        self.batch_ids: list[Any] = []
        self._dl: patches.Patch | None = None
        self._found: Any = None  # the model picked from a heap walk's candidates (keep_root)
        self._candidates: list[Any] | None = None  # the walk's modules, largest first
        self._find_at = -1e9
        self._root: Any = None
        self._root_hook: Any = None
        self._map: ModuleMap | None = None

    def wrap_dataloader(self) -> None:
        """Writer tick (under the recorder's lock): wrap ``_next_index`` once it is imported."""
        if self._dl is None and (dl := imported("torch.utils.data.dataloader")) is not None:
            cls = dl._BaseDataLoaderIter
            orig = cls.__dict__.get("_next_index")
            if orig is not None:
                self._dl = patches.replace(
                    cls, "_next_index", _keep_indices(orig), by="numerics",
                    why="keeps the sample indices of each batch, for a NaN's origin")

    def remove(self) -> None:
        if self._root_hook is not None:
            self._root_hook.remove()
        if self._dl is not None:
            patches.restore(self._dl)
            self._dl = None

    def on_batch(self, it: Any) -> None:
        """The loop monitor took a batch from ``it``: its sampler indices."""
        q = it.__dict__.get("_probe_indices")
        ids = q.popleft() if q else None
        if len(self.batch_ids) < MAX_CALLS:
            self.batch_ids.append(ids)

    def step_done(self) -> None:
        self.calls, self.batch_ids = [], []

    def find_model(self, torch: Any, clock: Any, tracer: Any) -> None:
        """Writer tick: when no tracer names the root model, find it once with a heap walk;
        the training thread hooks it (keep_root)."""
        if self._root is not None or self._found is not None or \
                self._candidates is not None or not clock.seen_step or \
                getattr(tracer, "_first_root", None) is not None or \
                time.monotonic() - self._find_at < 30 or torch is None:
            return
        self._find_at = time.monotonic()
        wanted = {id(p) for o in clock.optimizers() for g in getattr(o, "param_groups", ())
                  for p in g["params"]}
        if not wanted:
            return
        from ..heapscan import live_objects

        mods = live_objects({"m": (torch.nn.Module,)})["m"]
        ranked = []
        for m in mods:
            try:
                ps = [p for p in m.parameters() if p.requires_grad]
            except RuntimeError:
                continue
            if any(id(p) in wanted for p in ps):  # judged at a boundary (module docstring)
                ranked.append((len(ps), unwrap(m)))
        ranked.sort(key=lambda r: -r[0])
        out: dict[int, Any] = {}
        for _, m in ranked:
            if len(out) < MAX_CANDIDATES:
                out.setdefault(id(m), m)
        self._candidates = list(out.values())

    def keep_root(self, torch: Any, tracer: Any, clock: Any = None) -> None:
        """Training thread: hook the root model to keep each step's calls, once it is known."""
        root = getattr(tracer, "_first_root", None) or getattr(tracer, "root", None) or \
            self._found or self._pick(clock)
        if root is None or root is self._root:
            return
        if self._root_hook is not None:
            self._root_hook.remove()
        self._root = root
        self._map = None

        def keep(module: Any, args: Any, kwargs: Any) -> None:
            if torch.is_grad_enabled() and len(self.calls) < MAX_CALLS:
                self.calls.append((args, kwargs, _autocast(torch)))

        self._root_hook = root.register_forward_pre_hook(keep, with_kwargs=True)

    def _pick(self, clock: Any) -> Any:
        """At a step boundary: the largest of the walk's candidates that is the model (see the
        module docstring), or None (the writer walks again, 30 s later)."""
        candidates = self._candidates
        if not candidates or clock is None:
            return None
        self._candidates = None
        groups = [{id(p) for g in getattr(o, "param_groups", ()) for p in g["params"]
                   if p.requires_grad} for o in clock.optimizers()]
        wanted = set().union(*groups)
        for m in candidates:
            mine = {id(p) for p in m.parameters() if p.requires_grad}
            if mine and mine <= wanted and any(g and g <= mine for g in groups):
                self._found = m
                return m
        return None

    def module_map(self) -> ModuleMap | None:
        if self._root is None:
            return None
        model = unwrap(self._root)
        if self._map is None or self._map.model is not model:
            self._map = ModuleMap(model)
        return self._map


def samples_text(batch_ids: list[Any]) -> str | None:
    """The step's batches' sample indices, for an anomaly row."""
    parts = []
    for i, ids in enumerate(batch_ids[:8]):
        if isinstance(ids, (list, tuple)):
            shown = ", ".join(str(x) for x in ids[:32]) + (", ..." if len(ids) > 32 else "")
            parts.append(f"batch {i}: [{shown}]")
        elif ids is not None:
            parts.append(f"batch {i}: {ids}")
    return "; ".join(parts) or None


def _keep_indices(orig: Any) -> Any:
    @functools.wraps(orig)
    def _next_index(it: Any) -> Any:
        idx = orig(it)
        q = it.__dict__.get("_probe_indices")
        if q is None:
            q = it.__dict__["_probe_indices"] = collections.deque(maxlen=256)
        q.append(idx)
        return idx

    return _next_index


def _autocast(torch: Any) -> Any:
    for dev in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(dev):
                return dev, torch.get_autocast_dtype(dev)
        except (RuntimeError, TypeError):
            continue
    return None
