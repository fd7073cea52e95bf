"""Finding a job's model, optimizers and LR schedulers without knowing its variable names.

Used by the built-in step-boundary actions (``probe lr``, ``probe checkpoint``); runs on the
training thread at a step boundary, so it may look at live objects without racing the step.

- Optimizers: every ``torch.optim.Optimizer`` the step clock has seen stepping
  (``StepClock.optimizers()``). A job's optimizers are exactly the ones that step.
- Model(s): the ``nn.Module`` roots that own the optimizers' parameters. Candidates are the
  modules in the training script's namespace (``__main__`` globals and the training thread's
  frame locals, plus one attribute level, so ``trainer.model`` is found), then, only if those do
  not cover the parameters, every live ``nn.Module`` (``gc``). Among candidates that cover the
  same parameters the larger one wins (the root, with its frozen parts, not just the trained
  head). Wrappers are unwrapped for saving: DDP / DataParallel to ``.module``, ``torch.compile``
  to ``._orig_mod``; FSDP is kept (it is saved sharded). ``--model NAME`` (a dotted name in that
  namespace) overrides the search.
- Schedulers: every live LR scheduler (``gc``) whose ``.optimizer`` is one of those optimizers.
  The scan costs about 50-100 ms per million live objects, once per action.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

from ..operator_code import script_namespace


def training_namespace() -> dict[str, Any]:
    """Names the training code sees here. Called on the training thread, so the script's own
    frames are the callers of ``optimizer.step()`` (operator_code.script_namespace)."""
    return script_namespace(sys._getframe(1))


def resolve_name(ns: dict[str, Any], dotted: str) -> Any:
    """``trainer.model`` in ``ns``; raises LookupError naming what is missing."""
    head, *rest = dotted.split(".")
    if head not in ns:
        raise LookupError(f"no name {head!r} in the training script's globals or frame locals")
    obj = ns[head]
    for part in rest:
        if not hasattr(obj, part):
            raise LookupError(f"{dotted}: {type(obj).__name__} has no attribute {part!r}")
        obj = getattr(obj, part)
    return obj


def unwrap(module: Any) -> tuple[Any, str]:
    """The module whose state_dict has the plain keys, and the attribute path taken."""
    path = ""
    for _ in range(4):
        inner = getattr(module, "_orig_mod", None)  # torch.compile's OptimizedModule
        attr = "._orig_mod"
        if inner is None and type(module).__name__ in ("DistributedDataParallel", "DataParallel"):
            inner, attr = getattr(module, "module", None), ".module"
        if inner is None:
            break
        module, path = inner, path + attr
    return module, path


def _candidates(ns: dict[str, Any], nn: Any) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for name, value in ns.items():
        if name.startswith("__") or isinstance(value, type):
            continue
        if isinstance(value, nn.Module):
            out.append((name, value))
            continue
        attrs = getattr(value, "__dict__", None)
        if isinstance(attrs, dict) and not isinstance(value, type(sys)):
            for attr, inner in list(attrs.items()):
                if isinstance(inner, nn.Module):
                    out.append((f"{name}.{attr}", inner))
    return out


def find_models(
    optimizers: list[Any], ns: dict[str, Any], override: str | None = None
) -> list[tuple[str, Any]]:
    """``[(name, module)]``: the fewest roots that own the optimizers' parameters (one, usually).

    Raises:
        LookupError: no module owns them, or ``override`` names nothing usable.
    """
    import torch.nn as nn

    if override:
        module = resolve_name(ns, override)
        if not isinstance(module, nn.Module):
            raise LookupError(f"--model {override} is a {type(module).__name__}, not an nn.Module")
        inner, path = unwrap(module)
        return [(override + path, inner)]
    wanted = {id(p) for o in optimizers for g in o.param_groups for p in g["params"]}
    if not wanted:
        raise LookupError("the optimizers have no parameters")
    cands = _candidates(ns, nn)
    chosen = _cover(cands, wanted)
    if chosen is None:  # not in the script's names: any live module
        # type(), not isinstance(): isinstance reads __class__, which some module-level
        # objects turn into a deprecation warning (torch.distributed.reduce_op).
        live = [(f"<{type(o).__name__} found by gc>", o) for o in gc.get_objects()
                if issubclass(type(o), nn.Module)]
        chosen = _cover(cands + live, wanted)
    if chosen is None:
        raise LookupError(
            "no nn.Module owns the optimizers' parameters; pass --model NAME (a global or a "
            "local of the training loop, dotted names like trainer.model work)"
        )
    out, seen = [], set()
    for name, module in chosen:
        inner, path = unwrap(module)
        if id(inner) not in seen:
            seen.add(id(inner))
            out.append((name + path, inner))
    return out


def _cover(cands: list[tuple[str, Any]], wanted: set[int]) -> list[tuple[str, Any]] | None:
    """Greedy set cover: most wanted parameters first, then the larger module (the root)."""
    sized = []
    seen: set[int] = set()
    for name, m in cands:
        if id(m) in seen:
            continue
        seen.add(id(m))
        ids = {id(p) for p in m.parameters()}
        if ids & wanted:
            sized.append((name, m, ids))
    left, chosen = set(wanted), []
    while left:
        best = max(sized, key=lambda c: (len(c[2] & left), len(c[2])), default=None)
        if best is None or not best[2] & left:
            return None
        chosen.append((best[0], best[1]))
        left -= best[2]
    return chosen


def find_schedulers(optimizers: list[Any]) -> list[Any]:
    """Live LR schedulers (``LRScheduler`` and ``ReduceLROnPlateau``) of these optimizers."""
    from torch.optim import lr_scheduler as ls

    kinds = tuple(
        k for k in (getattr(ls, "LRScheduler", None), getattr(ls, "_LRScheduler", None),
                    getattr(ls, "ReduceLROnPlateau", None)) if k is not None
    )
    ids = {id(o) for o in optimizers}
    found = [o for o in gc.get_objects()  # type(): see find_models
             if issubclass(type(o), kinds) and id(getattr(o, "optimizer", None)) in ids]
    return sorted(found, key=lambda s: (_container_rank(s), id(s)))


def _container_rank(s: Any) -> int:
    """Containers (SequentialLR, ChainedScheduler) after the schedulers they hold."""
    return 1 if hasattr(s, "_schedulers") else 0
