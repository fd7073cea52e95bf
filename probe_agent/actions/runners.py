"""What each kind of step-boundary action does, on the training thread at step N.

A runner fills the action's ``result`` (one line for `probe actions`) and ``data`` (the details)
and raises on failure; the queue (queue.py) records the state, the timing and the traceback.
``step-eval`` runs operator code under the same rules as ``/v1/eval`` (operator_code.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..operator_code import CodeRun, compile_code
from .objects import find_models, find_schedulers, training_namespace

if TYPE_CHECKING:
    from .queue import Action, ActionQueue


def run_code(q: ActionQueue, a: Action, step: int) -> None:
    run = CodeRun(q.evaluator.output_cap)
    try:
        run.execute(compile_code(a.code), session=q.evaluator.session,
                    namespace=training_namespace(),
                    extra={"probe_step": step, "probe_optimizers": q.clock.optimizers()})
        a.result = run.result
    finally:
        a.stdout, a.stderr = run.stdout, run.stderr


def run_lr(q: ActionQueue, a: Action, step: int) -> None:
    from .lr import change_lr

    opts = q.clock.optimizers()
    report = change_lr(opts, find_schedulers(opts), scale=a.args.get("scale"),
                       set_to=a.args.get("set"), force=bool(a.args.get("force")))
    report["step"] = step
    a.data = report
    a.result = ", ".join(
        f"{o['class']}[{i}] {g['before']:.6g} -> {g['after']:.6g}"
        for o in report["optimizers"] for i, g in enumerate(o["groups"])
    )


def run_checkpoint(q: ActionQueue, a: Action, step: int) -> None:
    from .checkpoint import save

    opts = q.clock.optimizers()
    models = find_models(opts, training_namespace(), a.args.get("model"))
    dist = q.agreement.distributed()
    world = dist.get_world_size() if dist is not None else 1
    a.data = save(str(a.args["path"]), step=step, rank=q.rank, world_size=world,
                  tag=a.id, models=models, optimizers=opts, schedulers=find_schedulers(opts),
                  overwrite=bool(a.args.get("overwrite")))
    a.result = ", ".join(f"{f['path']} ({f['bytes']} bytes)" for f in a.data["files"]) or (
        "nothing to write on this rank")


def run_pause(q: ActionQueue, a: Action, step: int) -> None:
    q.hold_at(step)
    a.data = {"paused_at": step}
    a.result = f"held after step {step}"


RUNNERS: dict[str, Callable[[ActionQueue, Action, int], None]] = {
    "step-eval": run_code, "lr": run_lr, "checkpoint": run_checkpoint, "pause": run_pause,
}
