"""ModuleNames: a traced call's module object -> its name code (writer thread only).

- **names**: a module's qualified name in its model (``layers.3.attn``), from the model's
  ``named_modules()`` (indexed once per model). The model is the top-most module above the called
  root whose trainable parameters the stepping optimizers hold (below any wrapper):
  Lightning never calls the LightningModule, only its ``self.net``, whose layers are then
  ``net.0``, not ``0``. Names given before any such model is known (before the first optimizer
  step) are given again once one is. Wrapper prefixes are dropped (``_orig_mod.`` of
  ``torch.compile``, ``module.`` of DDP and of a DeepSpeed engine, FSDP's and
  checkpoint-wrapper's inner names), so a compiled or wrapped model reports the names of the
  plain one. The root itself is named by its
  class (``GPT``), and ``root`` tells several root models apart (``GPT``, ``GPT#2``).
- **codes**: each (name, root label) pair gets a small int; rows carry the code and SQL joins
  the strings in (``table``), so the writer's per-row Python is one dict lookup.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from ...heapscan import live_objects
from .trace_graph_names import (
    LABEL,
    compiled_name,
    is_compiled_graph,
    part_graph_name,
    split_part,
)

#: Wrapper classes whose one child is the real model: attribute of the child.
_WRAPPERS = {"OptimizedModule": "_orig_mod", "DistributedDataParallel": "module",
             "DataParallel": "module", "DeepSpeedEngine": "module", "PipelineEngine": "module"}
#: Name components that wrappers insert at any depth.
_INNER = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
#: Beyond this many names (made up per call: rare), codes start over.
_MAX_CODES = 100_000
#: Seconds a map of module parents (one heap scan) is reused for naming newly called roots.
_PARENTS_TTL_S = 30.0


class ModuleNames:
    """Names and name codes of traced objects; ``version`` changes when ``table`` does."""

    def __init__(self, optimizers: Callable[[], list[Any]] = list) -> None:
        """``optimizers``: those the step clock saw stepping (the model roots they train name
        the modules)."""
        self._optimizers = optimizers
        self._names: dict[int, tuple[Any, str, str]] = {}
        self._labels: dict[int, tuple[Any, str]] = {}
        self._label_counts: dict[str, int] = {}
        # (module name, root label) -> code; id(object) -> (weakref, code) for the objects
        # already named (ids are checked against the weakref: ids are reused).
        self._interned: dict[tuple[str, str], int] = {}
        self._code_of: dict[int, tuple[Any, int]] = {}
        self.version = 0
        self._unowned = False  # a name was given while no optimizer had stepped
        self._parents: dict[int, Any] = {}  # id(child module) -> weakref to parent
        self._parents_at = -_PARENTS_TTL_S

    def _owner(self, root: Any) -> Any:
        """The top-most module above ``root`` whose trainable parameters the optimizers hold,
        below any wrapper (DDP, compile, Lightning's); ``root`` when it has no such parent."""
        wanted = self._optimized_params()
        if not wanted:
            self._unowned = True
            return root
        now = time.monotonic()
        if now - self._parents_at > _PARENTS_TTL_S:
            self._parents, self._parents_at = _parents(), now
        parents = self._parents
        m = root
        while True:
            ref = parents.get(id(m))
            p = ref() if ref is not None else None
            if p is None or not any(c is m for c in p._modules.values()) or _is_wrapper(p):
                return m
            if not all(id(x) in wanted for x in p.parameters() if x.requires_grad):
                return m
            m = p

    def _label(self, root: Any) -> str:
        hit = self._labels.get(id(root))
        if hit is not None and hit[0]() is root:
            return hit[1]
        inner = _unwrapped(root)[0]
        base = LABEL if is_compiled_graph(inner) else class_name(inner)
        n = self._label_counts.get(base, 0) + 1
        self._label_counts[base] = n
        label = base if n == 1 else f"{base}#{n}"
        self._labels[id(root)] = (weakref.ref(root), label)
        return label

    def _index(self, root: Any) -> None:
        label = self._label(root)
        inner, prefix = _unwrapped(root)
        try:
            named = list(root.named_modules())
        except RuntimeError:  # the training thread changed the model while we walked it
            return
        parent_of = {id(c): m for _, m in named for c in m._modules.values() if c is not None}
        for name, m in named:
            # torch.compile's graphs (and compile's wrapper around one): named by the model's
            # modules they hold
            graph = compiled_name(inner if m is root else m, name, parent_of.get(id(m)))
            part = split_part(m, name, parent_of.get(id(m)))
            if part is not None and part[2] is not None and part[2] is not m:
                # the graph a part runs is called as a module of its own: it carries the
                # part's time, so it gets the part's number and modules
                self._names[id(part[2])] = (weakref.ref(part[2]), part_graph_name(*part), LABEL)
                self._code_of.pop(id(part[2]), None)  # named on its own before: named again
            if graph is not None:
                self._names[id(m)] = (weakref.ref(m), graph, LABEL)
                continue
            parts = name.split(".") if name else []
            k = len(parts)
            if m is not inner and k < len(prefix) and parts == prefix[:k]:
                # a wrapper: DDP's own row by its class (its inner model is the label);
                # compile's OptimizedModule is the model itself
                clean = type(m).__name__ if prefix[k] == "module" else label
                self._names[id(m)] = (weakref.ref(m), clean, label)
                continue
            n = len(prefix) if parts[:len(prefix)] == prefix else 0
            clean = ".".join(p for p in parts[n:] if p not in _INNER)
            self._names[id(m)] = (weakref.ref(m), clean or label, label)

    def name(self, obj: Any, root: Any) -> tuple[str, str]:
        """(qualified name, root label) of a module called inside ``root``'s call."""
        hit = self._names.get(id(obj))
        if hit is not None and hit[0]() is obj:
            return hit[1], hit[2]
        if len(self._names) > _MAX_CODES:
            self._names = {k: v for k, v in self._names.items() if v[0]() is not None}
        for candidate in (root, obj):
            if candidate is None:
                continue
            candidate = self._owner(candidate)
            self._index(candidate)
            hit = self._names.get(id(obj))
            if hit is not None and hit[0]() is obj:
                return hit[1], hit[2]
        return type(obj).__name__, type(obj).__name__

    def codes(self, objs: list[Any], roots: list[Any], optimizer: set[int]) -> list[int]:
        """Each object's code; objects whose id is in ``optimizer`` are named by their class
        under the root label ``optimizer``. Names are looked up once per distinct object."""
        if self._unowned and self._optimized_params():
            # names given from a called root before any optimizer stepped: give them again
            # from the model it trains (codes stay: the rows kept for backward refer to them)
            self._unowned = False
            self._names.clear()
            self._code_of.clear()
        if len(self._interned) > _MAX_CODES:
            self._interned.clear()
            self._code_of.clear()
            self.version += 1
        known = self._code_of
        oids = list(map(id, objs))
        code_of: dict[int, int] = {}
        root_of = dict(zip(oids, roots))
        for oid, obj in dict(zip(oids, objs)).items():
            hit = known.get(oid)
            if hit is not None and hit[0]() is obj:
                code_of[oid] = hit[1]
                continue
            if oid in optimizer:
                nl = (type(obj).__name__, "optimizer")
            else:
                nl = self.name(obj, root_of[oid])
            code = self._interned.get(nl)
            if code is None:
                code = self._interned[nl] = len(self._interned)
                self.version += 1
            code_of[oid] = code
            if len(known) > _MAX_CODES:
                self._code_of = known = {k: v for k, v in known.items() if v[0]() is not None}
            try:
                known[oid] = (weakref.ref(obj), code)
            except TypeError:  # not weak-referenceable: looked up again next time
                pass
        return list(map(code_of.__getitem__, oids))

    def _optimized_params(self) -> set[int]:
        """ids of the parameters of the optimizers the agent saw stepping."""
        try:
            opts = self._optimizers()
            return {id(x) for o in opts for g in o.param_groups for x in g["params"]}
        except Exception:  # noqa: BLE001 - writer thread: a failure keeps the root's names
            return set()

    def table(self) -> pa.Table:
        """code -> (module, root) for every code handed out."""
        pairs = list(self._interned)
        return pa.table({
            "code": pa.array(range(len(pairs)), pa.int32()),
            "module": pa.array([p[0] for p in pairs], pa.string()),
            "root": pa.array([p[1] for p in pairs], pa.string()),
        })



def _unwrapped(root: Any) -> tuple[Any, list[str]]:
    """The model inside ``root``'s wrappers (compile over DDP over the model) and the
    attribute path to it (``["_orig_mod", "module"]``)."""
    m, path = root, list[str]()
    while (attr := _WRAPPERS.get(type(m).__name__)) is not None:
        child = getattr(m, "_modules", {}).get(attr)
        if child is None:
            break
        m, path = child, [*path, attr]
    return m, path


def _is_wrapper(module: Any) -> bool:
    from ...frameworks import unwrap

    return unwrap.model(module)[0] is not module


def _parents() -> dict[int, Any]:
    """id(child) -> weakref to its parent, over every live module: one heap scan, only when
    a new root is called (names are then known for all its modules)."""
    import torch.nn as nn  # the tracer runs: torch is loaded

    out: dict[int, Any] = {}
    for o in live_objects({"modules": (nn.Module,)})["modules"]:
        for child in o._modules.values():
            if child is not None:
                out.setdefault(id(child), weakref.ref(o))
    return out


def class_name(module: Any) -> str:
    """The user's class name: FSDP2's ``fully_shard`` swaps a module's class for a generated
    ``FSDP<Name>(FSDPModule, <Name>)``, which is not what the user wrote."""
    cls = type(module)
    bases = cls.__bases__
    if len(bases) == 2 and bases[0].__name__ == "FSDPModule":
        return bases[1].__name__
    return cls.__name__
