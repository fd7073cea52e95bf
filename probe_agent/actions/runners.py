"""What each kind of step-boundary action does, on the training thread at step N.

A runner fills the action's ``result`` (one line for `probe actions`) and ``data`` (the details)
and raises on failure; the queue (queue.py) records the state, the timing and the traceback.
``step-eval`` runs operator code under the same rules as ``/v1/eval`` (operator_code.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..frameworks.deepspeed import engine_of
from ..frameworks.playbook import resolve
from ..operator_code import CodeRun, compile_code
from .objects import discovered, find_models, training_namespace

if TYPE_CHECKING:
    from .queue import Action, ActionQueue


def run_code(q: ActionQueue, a: Action, step: int) -> None:
    run = CodeRun(q.evaluator.output_cap)
    try:
        opts = q.clock.optimizers()
        run.execute(compile_code(a.code), session=q.evaluator.session,
                    namespace=training_namespace(),
                    extra={"probe_step": step, "probe_optimizers": opts},
                    playbook=lambda names: resolve(names, sys._getframe(), opts))
        a.result = run.result
    finally:
        a.stdout, a.stderr = run.stdout, run.stderr


def run_lr(q: ActionQueue, a: Action, step: int) -> None:
    from .lr import change_lr

    d = discovered(q.clock.optimizers())  # the framework's objects, wrappers off
    report = change_lr(d.optimizers, d.schedulers, scale=a.args.get("scale"),
                       set_to=a.args.get("set"), force=bool(a.args.get("force")),
                       names=d.where)
    report["step"] = step
    report["framework"] = d.framework
    if not report["schedulers"]:  # nothing to simulate: look at the next step instead
        from .lr_holds import watch_next_step

        report["watch_next_step"] = True
        watch_next_step(q.clock, a, d.optimizers)
    a.data = report
    a.result = ", ".join(
        f"{o['class']}[{i}] {g['before']:.6g} -> {g['after']:.6g}"
        for o in report["optimizers"] for i, g in enumerate(o["groups"])
    )


def run_checkpoint(q: ActionQueue, a: Action, step: int) -> None:
    from .checkpoint import checkpoint_names, save

    d = discovered(q.clock.optimizers())  # the framework's objects, wrappers off
    models = find_models(d.optimizers, training_namespace(), a.args.get("model"), d)
    dist = q.agreement.distributed()
    world = dist.get_world_size() if dist is not None else 1
    engine = engine_of(d.trainer)
    if engine is not None:  # ZeRO partitions: gathered and saved collectively
        from . import checkpoint_deepspeed

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


def run_pause(q: ActionQueue, a: Action, step: int) -> None:
    q.hold_at(step)
    a.data = {"paused_at": step}
    a.result = f"held after step {step}"


def run_profile(q: ActionQueue, a: Action, step: int) -> None:
    from .profile import run_profile as start_window

    start_window(q, a, step)


RUNNERS: dict[str, Callable[[ActionQueue, Action, int], None]] = {
    "step-eval": run_code, "lr": run_lr, "checkpoint": run_checkpoint, "pause": run_pause,
    "profile": run_profile,
}
