"""``step-eval``: operator code on the training thread at step N, under the same rules as
``/v1/eval`` (operator_code.py); the repr of a trailing expression comes back."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ...frameworks.playbook import resolve
from ...operator_code import CodeRun, compile_code
from ..objects import training_namespace
from .base import ActionKind, Fields

if TYPE_CHECKING:
    from ..queue import Action, ActionQueue


def run(q: ActionQueue, a: Action, step: int) -> None:
    code_run = CodeRun(q.evaluator.output_cap)
    try:
        opts = q.clock.optimizers()
        code_run.execute(compile_code(a.code), session=q.evaluator.session,
                         namespace=training_namespace(),
                         extra={"probe_step": step, "probe_optimizers": opts},
                         playbook=lambda names: resolve(names, sys._getframe(), opts))
        a.result = code_run.result
    finally:
        a.stdout, a.stderr = code_run.stdout, code_run.stderr


def _validate(fields: Fields) -> str | None:
    return None if str(fields.get("code") or "").strip() else "step-eval needs code"


KIND = ActionKind("step-eval", run, describe=lambda f: str(f.get("code") or ""),
                  validate=_validate)
