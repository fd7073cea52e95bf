"""Lightning (``lightning.Trainer`` and the older ``pytorch_lightning.Trainer``).

``trainer.optimizers`` are the torch optimizers (the ``LightningOptimizer`` wrappers live in the
strategy), ``trainer.lr_scheduler_configs[i].scheduler`` the schedulers, ``trainer.
lightning_module`` the user's module (the LightningModule itself is never called: its ``self.net``
is), ``trainer.train_dataloader`` the loader ``fit`` iterates.
"""

from __future__ import annotations

from . import unwrap
from .base import Context, Discovered, loaded_class

name = "lightning"
trainer_classes = ("lightning.pytorch.trainer.trainer.Trainer",
                   "pytorch_lightning.trainer.trainer.Trainer")


def find(ctx: Context) -> Discovered | None:
    classes = [c for c in (loaded_class(q) for q in trainer_classes) if c is not None]
    found = [f for cls in classes for f in ctx.instances(cls)]
    if not found:
        return None
    stepping = {id(o) for o in ctx.stepping}
    where, tr = next(((w, t) for w, t in found
                      if any(id(o) in stepping for o in _optimizers(t))), found[0])
    label = where if where in ctx.namespace else "trainer"
    d = Discovered(name, trainer=tr)
    d.where[id(tr)] = label
    for i, opt in enumerate(_optimizers(tr)):
        inner = unwrap.optimizer(opt)
        d.optimizers.append(inner)
        d.where[id(inner)] = f"{label}.optimizers[{i}]"
    for i, conf in enumerate(getattr(tr, "lr_scheduler_configs", None) or []):
        sched = unwrap.scheduler(conf)
        d.schedulers.append(sched)
        d.where[id(sched)] = f"{label}.lr_scheduler_configs[{i}].scheduler"
    module = getattr(tr, "lightning_module", None)
    if module is not None:
        inner, path = unwrap.model(module)
        d.models.append((f"{label}.lightning_module{path}", inner))
        d.wrapped_models.append((f"{label}.lightning_module{path}", inner))
    try:
        loader = tr.train_dataloader
    except (AttributeError, RuntimeError):  # before fit() set up its loops
        loader = None
    if loader is not None:
        d.train_loader = loader
        d.where[id(loader)] = f"{label}.train_dataloader"
    return d


def _optimizers(tr: object) -> list[object]:
    try:
        return list(getattr(tr, "optimizers", None) or [])
    except (AttributeError, RuntimeError):  # a property that needs a strategy set up
        return []
