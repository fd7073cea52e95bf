"""Finding a job's model, optimizers and LR schedulers for the step-boundary actions.

``probe lr`` and ``probe checkpoint`` run on the training thread at a step boundary, so they may
look at live objects without racing the step. What to change and save comes from the framework
layer (probe_agent/frameworks): under the HF Trainer the torch optimizer behind
``trainer.optimizer`` and the LambdaLR ``trainer.lr_scheduler`` (whose ``.optimizer`` is
Accelerate's wrapper), under Lightning ``trainer.optimizers`` and ``lr_scheduler_configs``, in a
hand-written loop the optimizers the step clock saw stepping, the fewest ``nn.Module`` roots that
own their parameters, and every live scheduler of theirs. Models are saved unwrapped (DDP,
DataParallel, torch.compile, DeepSpeed, Lightning's wrapper) so their keys load into a bare
model; an FSDP1 wrapper is kept (it is saved sharded). ``--model NAME`` (a dotted name in the
training script's namespace) overrides the search.
"""

from __future__ import annotations

import sys
from typing import Any

from ..frameworks import Discovered, discover, unwrap
from ..operator_code import script_namespace


def training_namespace() -> dict[str, Any]:
    """Names the training code sees here. Called on the training thread, so the script's own
    frames are the callers of ``optimizer.step()`` (operator_code.script_namespace)."""
    return script_namespace(sys._getframe(1))


def discovered(stepping: list[Any]) -> Discovered:
    """The job's objects, seen from the training thread (the caller's frames), rescanned now:
    an action runs once, and must not act on a stale view."""
    return discover(frame=sys._getframe(1), optimizers=stepping, fresh=True)


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


def find_models(
    optimizers: list[Any], ns: dict[str, Any], override: str | None = None,
    found: Discovered | None = None,
) -> list[tuple[str, Any]]:
    """``[(name, module)]`` to save: the fewest roots that own the optimizers' parameters.

    Raises:
        LookupError: no module owns them, or ``override`` names nothing usable.
    """
    import torch.nn as nn

    if override:
        module = resolve_name(ns, override)
        if not isinstance(module, nn.Module):
            raise LookupError(f"--model {override} is a {type(module).__name__}, not an nn.Module")
        inner, path = unwrap.model(module, keep_fsdp=True)
        return [(override + path, inner)]
    d = found if found is not None else discover(frame=sys._getframe(1), optimizers=optimizers)
    if not d.models_fixed and not any(g["params"] for o in d.optimizers for g in o.param_groups):
        raise LookupError("the optimizers have no parameters")
    if not d.wrapped_models:
        raise LookupError(
            "no nn.Module owns the optimizers' parameters; pass --model NAME (a global or a "
            "local of the training loop, dotted names like trainer.model work)"
        )
    return list(d.wrapped_models)


def find_schedulers(optimizers: list[Any]) -> list[Any]:
    """Live LR schedulers (``LRScheduler`` and ``ReduceLROnPlateau``) of these optimizers,
    matched through optimizer wrappers; containers (SequentialLR) after what they hold."""
    d = discover(frame=sys._getframe(1), optimizers=optimizers, fresh=True)
    ids = {id(o) for o in optimizers}
    return [s for s in d.schedulers
            if id(unwrap.optimizer(getattr(s, "optimizer", None))) in ids]
