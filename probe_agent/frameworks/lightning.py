"""Lightning (``lightning.Trainer`` and the older ``pytorch_lightning.Trainer``).

``trainer.optimizers`` are the torch optimizers (the ``LightningOptimizer`` wrappers live in the
strategy), ``trainer.lr_scheduler_configs[i].scheduler`` the schedulers, ``trainer.
lightning_module`` the user's module (the LightningModule itself is never called: its ``self.net``
is), ``trainer.train_dataloader`` the loader ``fit`` iterates.
"""

from __future__ import annotations

from .base import Context, Discovered
from .deepspeed import engine_of

name = "lightning"
trainer_classes = ("lightning.pytorch.trainer.trainer.Trainer",
                   "pytorch_lightning.trainer.trainer.Trainer")


def find(ctx: Context) -> Discovered | None:
    picked = ctx.trainer(trainer_classes, _optimizers, "trainer")
    if picked is None:
        return None
    label, tr = picked
    d = Discovered(name, trainer=tr)
    d.where[id(tr)] = label
    # under DeepSpeed the optimizer holds ZeRO partitions, not the model's parameters
    d.models_fixed = engine_of(tr) is not None
    for i, opt in enumerate(_optimizers(tr)):
        d.add_optimizer(opt, f"{label}.optimizers[{i}]")
    for i, conf in enumerate(getattr(tr, "lr_scheduler_configs", None) or []):
        d.add_scheduler(conf, f"{label}.lr_scheduler_configs[{i}]", ".scheduler")
    module = getattr(tr, "lightning_module", None)
    if module is not None:
        d.add_model(module, f"{label}.lightning_module")
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
