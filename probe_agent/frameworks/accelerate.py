"""A plain Accelerate loop: ``accelerator.prepare(model, optimizer, loader, scheduler)``.

The ``Accelerator`` keeps what it prepared: ``_models`` (maybe DDP/FSDP/compile-wrapped),
``_optimizers`` (``AcceleratedOptimizer``), ``_schedulers`` (``AcceleratedScheduler``) and
``_dataloaders``. A Trainer's own Accelerator is the hf_trainer adapter's business: that one runs
first.
"""

from __future__ import annotations

from . import unwrap
from .base import Context, Discovered, loaded_class

name = "accelerate"
trainer_classes = ("accelerate.accelerator.Accelerator",)


def find(ctx: Context) -> Discovered | None:
    cls = loaded_class(trainer_classes[0])
    if cls is None:
        return None
    found = ctx.instances(cls)
    if not found:
        return None
    stepping = {id(o) for o in ctx.stepping}
    where, acc = next(((w, a) for w, a in found
                       if any(id(unwrap.optimizer(o)) in stepping
                              for o in getattr(a, "_optimizers", []))), found[0])
    label = where if where in ctx.namespace else "accelerator"
    d = Discovered(name, trainer=acc)
    d.where[id(acc)] = label
    for i, opt in enumerate(getattr(acc, "_optimizers", [])):
        inner = unwrap.optimizer(opt)
        d.optimizers.append(inner)
        d.where[id(inner)] = f"{label}._optimizers[{i}].optimizer"
    for i, sched in enumerate(getattr(acc, "_schedulers", [])):
        inner = unwrap.scheduler(sched)
        d.schedulers.append(inner)
        d.where[id(inner)] = f"{label}._schedulers[{i}].scheduler"
    for i, model in enumerate(getattr(acc, "_models", [])):
        inner, path = unwrap.model(model)
        kept, kpath = unwrap.model(model, keep_fsdp=True)
        d.models.append((f"{label}._models[{i}]{path}", inner))
        d.wrapped_models.append((f"{label}._models[{i}]{kpath}", kept))
    loaders = list(getattr(acc, "_dataloaders", []))
    if loaders:
        d.train_loader = loaders[0]
        d.where[id(loaders[0])] = f"{label}._dataloaders[0]"
    return d
