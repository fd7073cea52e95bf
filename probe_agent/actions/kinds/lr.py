"""``lr``: scale or set every learning rate at step N (actions/lr.py does the change)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..objects import discovered
from .base import ActionKind, Fields, present

if TYPE_CHECKING:
    from ..queue import Action, ActionQueue


def run(q: ActionQueue, a: Action, step: int) -> None:
    from ..lr import change_lr

    d = discovered(q.clock.optimizers())  # the framework's objects, wrappers off
    report = change_lr(d.optimizers, d.schedulers, scale=a.args.get("scale"),
                       set_to=a.args.get("set"), force=bool(a.args.get("force")),
                       names=d.where)
    report["step"] = step
    report["framework"] = d.framework
    if not report["schedulers"]:  # nothing to simulate: look at the next step instead
        from ..lr_holds import watch_next_step

        report["watch_next_step"] = True
        watch_next_step(q.clock, a, d.optimizers)
    a.data = report
    a.result = ", ".join(
        f"{o['class']}[{i}] {g['before']:.6g} -> {g['after']:.6g}"
        for o in report["optimizers"] for i, g in enumerate(o["groups"])
    )


def _check(q: ActionQueue, args: dict[str, Any]) -> None:
    from ..lr import check_args

    check_args(q.clock.optimizers(), args)


def _validate(fields: Fields) -> str | None:
    if (fields.get("scale") is None) == (fields.get("set") is None):
        return "lr needs exactly one of scale or set"
    return None


def _describe(fields: Fields) -> str:
    scale = fields.get("scale")
    what = f"lr scale={scale}" if scale is not None else f"lr set={fields.get('set')}"
    return what + (" force" if fields.get("force") else "")


KIND = ActionKind("lr", run, describe=_describe, validate=_validate, check=_check,
                  args=lambda f: present(f, "scale", "set", "force"))
