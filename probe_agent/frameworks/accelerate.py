"""A plain Accelerate loop: ``accelerator.prepare(model, optimizer, loader, scheduler)``.

The ``Accelerator`` keeps what it prepared: ``_models`` (maybe DDP/FSDP/compile-wrapped),
``_optimizers`` (``AcceleratedOptimizer``), ``_schedulers`` (``AcceleratedScheduler``) and
``_dataloaders``. A Trainer's own Accelerator is the hf_trainer adapter's business: that one runs
first.
"""

from __future__ import annotations

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
        d.add_optimizer(opt, f"{label}._optimizers[{i}]", ".optimizer")
    for i, sched in enumerate(getattr(acc, "_schedulers", [])):
        d.add_scheduler(sched, f"{label}._schedulers[{i}]", ".scheduler")
    for i, model in enumerate(getattr(acc, "_models", [])):
        d.add_model(model, f"{label}._models[{i}]")
    loaders = list(getattr(acc, "_dataloaders", []))
    if loaders:
        d.add_loader(loaders[0], f"{label}._dataloaders[0]")
    return d
