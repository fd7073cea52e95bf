"""A plain Accelerate loop: ``accelerator.prepare(model, optimizer, loader, scheduler)``.

The ``Accelerator`` keeps what it prepared: ``_models`` (maybe DDP/FSDP/compile-wrapped),
``_optimizers`` (``AcceleratedOptimizer``), ``_schedulers`` (``AcceleratedScheduler``) and
``_dataloaders``. A Trainer's own Accelerator is the hf_trainer adapter's business: that one runs
first.
"""

from __future__ import annotations

from . import unwrap
from .base import Context, Discovered

name = "accelerate"
trainer_classes = ("accelerate.accelerator.Accelerator",)


def find(ctx: Context) -> Discovered | None:
    picked = ctx.trainer(trainer_classes, lambda a: getattr(a, "_optimizers", None),
                         "accelerator")
    if picked is None:
        return None
    label, acc = picked
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
