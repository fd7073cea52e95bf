"""``checkpoint``: save the model, optimizers, schedulers and RNG at step N (actions/checkpoint.py;
DeepSpeed's ZeRO partitions through actions/checkpoint_deepspeed.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...frameworks.deepspeed import engine_of
from ..objects import discovered, find_models, training_namespace
from .base import ActionKind, Fields, present

if TYPE_CHECKING:
    from ..queue import Action, ActionQueue


def run(q: ActionQueue, a: Action, step: int) -> None:
    from ..checkpoint import checkpoint_names, save

    d = discovered(q.clock.optimizers())  # the framework's objects, wrappers off
    models = find_models(d.optimizers, training_namespace(), a.args.get("model"), d)
    dist = q.agreement.distributed()
    world = dist.get_world_size() if dist is not None else 1
    engine = engine_of(d.trainer)
    if engine is not None:  # ZeRO partitions: gathered and saved collectively
        from .. import checkpoint_deepspeed

        a.data = checkpoint_deepspeed.save(
            str(a.args["path"]), engine=engine, model=models[0][1], step=step, rank=q.rank,
            world_size=world, tag=a.id, schedulers=d.schedulers,
            overwrite=bool(a.args.get("overwrite")), framework=d.framework,
            names=checkpoint_names(models, d.optimizers, d.schedulers, d.where))
        a.result = ", ".join(f"{f['path']} ({f['bytes']} bytes)" for f in a.data["files"])
        return
    a.data = save(str(a.args["path"]), step=step, rank=q.rank, world_size=world,
                  tag=a.id, models=models, optimizers=d.optimizers, schedulers=d.schedulers,
                  overwrite=bool(a.args.get("overwrite")), framework=d.framework,
                  where=d.where, scaler=q.scaler())
    a.result = ", ".join(f"{f['path']} ({f['bytes']} bytes)" for f in a.data["files"]) or (
        "nothing to write on this rank")


def _check(q: ActionQueue, args: dict[str, Any]) -> None:
    from ..checkpoint_target import check_args

    dist = q.agreement.distributed()
    check_args(args, q.rank, dist.get_world_size() if dist is not None else 1)


def _describe(fields: Fields) -> str:
    model = fields.get("model")
    return (f"checkpoint {fields.get('path')}" + (f" model={model}" if model else "")
            + (" overwrite" if fields.get("overwrite") else ""))


KIND = ActionKind(
    "checkpoint", run, describe=_describe, check=_check,
    validate=lambda f: None if f.get("path") else "checkpoint needs a path",
    args=lambda f: present(f, "path", "model", "overwrite"))
