"""The hand-written loop (nanoGPT's train.py, toy scripts), and the gaps every adapter fills.

``find`` always answers: the optimizers are those the step clock saw stepping (or, before the
first step, the script's ``Optimizer`` names), the model the fewest modules that own their
parameters, the schedulers every live one whose optimizer (through wrappers) is one of them, the
loader the script's ``train_loader`` or its one ``DataLoader``. ``complete`` does the same for a
framework adapter's partial answer, so that an optimizer the framework does not list (a second
one the user steps by hand) is still changed and saved.
"""

from __future__ import annotations

import sys
from typing import Any

from ..heapscan import live_objects
from . import unwrap
from .base import Context, Discovered

name = "plain"
trainer_classes: tuple[str, ...] = ()


def find(ctx: Context) -> Discovered:
    d = Discovered("plain")
    trainer = ctx.namespace.get("trainer")
    if trainer is not None and not isinstance(trainer, type):
        d.trainer = trainer
        d.where[id(trainer)] = "trainer"
    return complete(d, ctx)


def complete(d: Discovered, ctx: Context) -> Discovered:
    """Fill in what the adapter left out (in place; returns ``d``)."""
    _add_optimizers(d, ctx)
    _add_schedulers(d, ctx)
    if d.optimizers:
        _cover_models(d, ctx)
    if d.train_loader is None:
        d.train_loader = _loader(d, ctx)
    return d


def _add_optimizers(d: Discovered, ctx: Context) -> None:
    have = {id(o) for o in d.optimizers}
    for o in ctx.stepping:
        if id(o) not in have:
            have.add(id(o))
            d.optimizers.append(o)
            d.where.setdefault(id(o), _script_name(ctx, o) or f"<{type(o).__name__} stepping>")
            if d.framework != "plain":
                d.notes.append(f"{type(o).__name__} steps but {d.framework} does not list it; "
                               "it is included")
    if d.optimizers:
        return
    optim = sys.modules.get("torch.optim")
    if optim is None:
        return
    for where, value in ctx.namespace.items():  # before the first step: the script's names
        if isinstance(value, optim.Optimizer):
            inner = unwrap.optimizer(value)
            if id(inner) not in have:
                have.add(id(inner))
                d.optimizers.append(inner)
                d.where[id(inner)] = where
    if d.optimizers:
        d.notes.append("no optimizer has stepped yet: optimizers taken from the script's names")


def _script_name(ctx: Context, obj: Any) -> str | None:
    for where, value in ctx.namespace.items():
        if value is obj:
            return where
    return None


def _add_schedulers(d: Discovered, ctx: Context) -> None:
    ids = {id(o) for o in d.optimizers}
    have = {id(s) for s in d.schedulers}
    for s in ctx.live("scheduler"):
        if id(s) in have or id(unwrap.optimizer(getattr(s, "optimizer", None))) not in ids:
            continue
        have.add(id(s))
        d.schedulers.append(s)
        d.where.setdefault(id(s), _script_name(ctx, s) or f"<{type(s).__name__} found by gc>")
    # containers (SequentialLR, ChainedScheduler) after the schedulers they hold
    d.schedulers.sort(key=lambda s: 1 if hasattr(s, "_schedulers") else 0)


def _cover_models(d: Discovered, ctx: Context) -> None:
    """Keep the adapter's models if they own every optimizer parameter; else the fewest
    modules that do, from the adapter's models, the script's names, then gc."""
    import torch.nn as nn

    wanted = {id(p) for o in d.optimizers for g in o.param_groups for p in g["params"]}
    if not wanted:
        return
    owned = {id(p) for _, m in d.models for p in m.parameters()}
    if d.models and (d.models_fixed or wanted <= owned):
        return
    cands = list(d.models) + _module_candidates(ctx, nn)
    chosen = cover(cands, wanted)
    if chosen is None:  # not in the script's names: any live module
        live = [(f"<{type(o).__name__} found by gc>", o)
                for o in live_objects({"modules": (nn.Module,)})["modules"]]
        chosen = cover(cands + live, wanted)
    if chosen is None:
        d.notes.append("no nn.Module owns the optimizers' parameters")
        return
    models, wrapped, seen = [], [], set()
    for where, module in chosen:
        outer, opath = unwrap.model(module, keep_fsdp=True)
        inner, path = unwrap.model(module)
        if id(inner) not in seen:
            seen.add(id(inner))
            models.append((where + path, inner))
            wrapped.append((where + opath, outer))
    d.models, d.wrapped_models = models, wrapped


def _module_candidates(ctx: Context, nn: Any) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for where, value in ctx.namespace.items():
        if where.startswith("__") or isinstance(value, type):
            continue
        if isinstance(value, nn.Module):
            out.append((where, value))
            continue
        attrs = getattr(value, "__dict__", None)
        if isinstance(attrs, dict) and not isinstance(value, type(sys)):
            for attr, inner in list(attrs.items()):
                if isinstance(inner, nn.Module):
                    out.append((f"{where}.{attr}", inner))
    return out


def cover(cands: list[tuple[str, Any]], wanted: set[int]) -> list[tuple[str, Any]] | None:
    """Greedy set cover: most wanted parameters first, then the larger module (the root)."""
    sized = []
    seen: set[int] = set()
    for where, m in cands:
        if id(m) in seen:
            continue
        seen.add(id(m))
        ids = {id(p) for p in m.parameters()}
        if ids & wanted:
            sized.append((where, m, ids))
    left, chosen = set(wanted), []
    while left:
        best = max(sized, key=lambda c: (len(c[2] & left), len(c[2])), default=None)
        if best is None or not best[2] & left:
            return None
        chosen.append((best[0], best[1]))
        left -= best[2]
    return chosen


def _loader(d: Discovered, ctx: Context) -> Any:
    data = sys.modules.get("torch.utils.data")
    if data is None:
        return None
    named = [(w, v) for w, v in ctx.namespace.items() if isinstance(v, data.DataLoader)]
    for where, value in named:
        if where == "train_loader":
            return value
    train = [(w, v) for w, v in named if "train" in w] or named
    if len({id(v) for _, v in train}) == 1:
        d.where[id(train[0][1])] = train[0][0]
        return train[0][1]
    if len(named) > 1:
        d.notes.append("several DataLoaders and none named train_loader: "
                       + ", ".join(w for w, _ in named))
    return None
