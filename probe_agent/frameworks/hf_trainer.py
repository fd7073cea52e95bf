"""Hugging Face ``transformers.Trainer`` (on Accelerate).

The Trainer keeps ``model`` (the user's model), ``model_wrapped`` (DDP, DeepSpeed, FSDP or
compile around it), ``optimizer`` (an ``AcceleratedOptimizer`` whose ``.optimizer`` is the torch
optimizer that steps) and ``lr_scheduler`` (created with the *wrapped* optimizer, so its
``.optimizer`` is not the object that steps; under DeepSpeed an ``AcceleratedScheduler``). The
loader its loop iterates is the ``train_dataloader`` local of ``_inner_training_loop``.
With several Trainers alive, the one whose optimizer steps wins.
"""

from __future__ import annotations

from typing import Any

from . import unwrap
from .base import Context, Discovered
from .deepspeed import engine_of

name = "hf_trainer"
trainer_classes = ("transformers.trainer.Trainer",)


def find(ctx: Context) -> Discovered | None:
    picked = ctx.trainer(trainer_classes, lambda t: [getattr(t, "optimizer", None)], "trainer")
    if picked is None:
        return None
    label, tr = picked
    d = Discovered(name, trainer=tr)
    d.where[id(tr)] = label
    # under DeepSpeed the optimizer holds ZeRO partitions, not the model's parameters
    d.models_fixed = engine_of(tr) is not None
    opt = getattr(tr, "optimizer", None)
    if opt is not None:
        d.add_optimizer(opt, f"{label}.optimizer", ".optimizer")
    sched = getattr(tr, "lr_scheduler", None)
    if sched is not None:
        d.add_scheduler(sched, f"{label}.lr_scheduler", ".scheduler")
    model = getattr(tr, "model", None)
    if model is not None:
        inner, path = unwrap.model(model)
        outer = getattr(tr, "model_wrapped", None) or model
        kept, kpath = unwrap.model(outer, keep_fsdp=True)
        d.models.append((f"{label}.model{path}", inner))
        kept_name = (f"{label}.model{path}" if kept is inner
                     else f"{label}.model_wrapped{kpath}")  # an FSDP1 wrapper, kept for saving
        d.wrapped_models.append((kept_name, kept))
    loader = _loader(ctx, tr)
    if loader is not None:
        d.add_loader(loader, "train_dataloader (the Trainer loop's local)")
    return d


def _loader(ctx: Context, tr: Any) -> Any:
    for loc in ctx.frame_locals:  # _inner_training_loop(self, ...): train_dataloader local
        if loc.get("self") is tr and loc.get("train_dataloader") is not None:
            return loc["train_dataloader"]
    dataset = getattr(tr, "train_dataset", None)
    for loader in ctx.live("loader"):
        if dataset is not None and getattr(loader, "dataset", None) is dataset:
            return loader
    return None
