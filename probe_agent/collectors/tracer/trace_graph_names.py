"""Names for the graphs torch.compile runs as modules (writer thread only).

With DDP, dynamo's DDPOptimizer splits a compiled model's graph at the gradient buckets into
``compiled_submod_0 ... compiled_submod_N`` of an ``fx.GraphModule``, and each part runs as a
module of its own: the tracer sees those calls, not the model's modules (they are inside the
compiled code). Their attribute names say nothing to the user, so each graph is named by the
model's modules whose code it holds, read from the ``nn_module_stack`` dynamo records on every
node: ``compiled graph 2/6 (blocks.0, blocks.1)``; the split graph itself is
``compiled graph (split in 6 at DDP's buckets: emb .. head)``.
"""

from __future__ import annotations

import re
from typing import Any

#: Root label of the graphs (they belong to no model's ``named_modules``).
LABEL = "torch.compile"
#: Modules listed in a graph's name; more are counted (``+3 more``).
MAX_LISTED = 4
#: Components wrappers put in module paths (as trace_names._INNER, plus DDP's ``module``).
_DROP = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
_LOCAL = re.compile(r"^L\[['\"][^'\"]+['\"]\]\.?|^L__self__[._]?")
_INDEX = re.compile(r"\[['\"]?([^'\"\]]+)['\"]?\]")


def is_compiled_graph(module: Any) -> bool:
    """A GraphModule dynamo made (not a model the user fx-traced and trains)."""
    if type(module).__name__ != "GraphModule" or not hasattr(module, "graph"):
        return False
    meta = getattr(module, "meta", None) or {}
    return "dynamo_compile_id" in meta or "partition_names" in meta or bool(_paths(module))


def _clean(path: str) -> str:
    path = _INDEX.sub(r".\1", _LOCAL.sub("", path))
    parts = [p for p in path.split(".") if p and p not in _DROP]
    while parts[:1] == ["module"]:  # DDP's (and DeepSpeed's) inner model
        parts = parts[1:]
    return ".".join(parts)


def _paths(gm: Any) -> list[str]:
    """The model's modules whose code ``gm``'s nodes come from, outermost kept: a module
    inside another listed one is left out."""
    seen: dict[str, None] = {}
    try:
        nodes = list(gm.graph.nodes)
    except Exception:  # noqa: BLE001 - a graph being rewritten: no name from it
        return []
    for n in nodes:
        stack = getattr(n, "meta", {}).get("nn_module_stack")
        if not stack:
            continue
        for value in stack.values():
            path = value[0] if isinstance(value, tuple) else value
            if isinstance(path, str):
                clean = _clean(path)
                if clean:
                    seen.setdefault(clean)
    paths = list(seen)
    return [p for p in paths if not any(p.startswith(q + ".") for q in paths if q != p)]


def _listed(paths: list[str]) -> str:
    if not paths:
        return "no module's code"
    if len(paths) <= MAX_LISTED:
        return ", ".join(paths)
    return f"{', '.join(paths[:MAX_LISTED - 1])} .. {paths[-1]} (+{len(paths) - MAX_LISTED} more)"


def _graph_of(part: Any) -> Any:
    """The GraphModule a split part (dynamo's ``WrapperModule``) runs, when it is one (the
    eager backends); a compiled callable (inductor) has no nodes left to read."""
    sub = getattr(part, "submod", None)
    sub = getattr(sub, "__self__", sub)
    return sub if type(sub).__name__ == "GraphModule" and hasattr(sub, "graph") else None


def is_split_part(module: Any) -> bool:
    cls = type(module)
    return cls.__name__ == "WrapperModule" and cls.__module__.startswith("torch._dynamo")


def split_part(module: Any, attr: str, parent: Any) -> tuple[int, int, Any] | None:
    """(part, parts, the GraphModule it runs or None) of a split graph's part
    ``compiled_submod_<part - 1>``; None for any other module."""
    split = re.fullmatch(r"compiled_submod_(\d+)", attr.rsplit(".", 1)[-1])
    if not split or parent is None or not (is_split_part(module) or is_compiled_graph(module)):
        return None
    total = sum(1 for c in getattr(parent, "_modules", {}) if c.startswith("compiled_submod_"))
    gm = module if is_compiled_graph(module) else _graph_of(module)
    return int(split.group(1)) + 1, total, gm


def part_graph_name(part: int, parts: int, gm: Any) -> str:
    """The name of the graph a split part runs: ``compiled graph 2/6 (emb, blocks.0)``."""
    what = _listed(_paths(gm)) if gm is not None else "a DDP bucket's modules, compiled"
    return f"compiled graph {part}/{parts} ({what})"


def compiled_name(module: Any, attr: str = "", parent: Any = None) -> str | None:
    """The name of a module torch.compile made (a graph, a part of a split graph), None for
    any other. ``attr`` and ``parent``: where it sits in the module that calls it
    (``compiled_submod_1`` of the split graph)."""
    split = split_part(module, attr, parent)
    if split is not None:
        if split[2] is module:  # the part is the graph itself
            return part_graph_name(*split)
        return f"DDP bucket split {split[0]}/{split[1]}"  # dynamo's wrapper that calls it
    if not is_compiled_graph(module):
        return None
    parts = [c for c, m in getattr(module, "_modules", {}).items()
             if m is not None and c.startswith("compiled_submod_")]
    if parts:
        return (f"compiled graph (split in {len(parts)} at DDP's buckets: "
                f"{_listed(_paths(module))})")
    return f"compiled graph ({_listed(_paths(module))})"
