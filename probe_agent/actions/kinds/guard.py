"""``guard``: arm (or with ``off``, disarm) the step guard at step N on every rank
(actions/guard.py): skip the optimizer step on a non-finite loss or gradients or a loss spike,
lower the LR, save a checkpoint before the step."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from .base import ActionKind, Fields

if TYPE_CHECKING:
    from ..queue import Action, ActionQueue

#: The rules a request may carry (``guard: {...}``).
RULES = ("skip_nonfinite", "skip_spike", "lower_lr", "checkpoint", "skip", "off")


def run(q: ActionQueue, a: Action, step: int) -> None:
    from ..guard import StepGuard

    rec = q.numerics()
    if rec is None:
        raise RuntimeError("the numerics recorder is not running on this rank: no guard")
    rules = dict(a.args.get("guard") or {})
    if rules.get("off"):
        old, rec.step_guard = rec.step_guard, None
        a.data = {"disarmed_at": step, "fired": old.fired if old is not None else 0}
        a.result = f"guard off after step {step}" + (
            f" (it fired {old.fired} times)" if old is not None else " (none was armed)")
        return

    def audit(code: str, outcome: str, error: str | None, at: int) -> None:
        q._audit_raw("guard", a.id, at, code, "agent", a.requested_by, outcome, error)

    def checkpoint(path: str, at: int) -> str:
        from . import checkpoint as ckpt

        target = os.path.join(path, f"guard-step{at}")
        stub = SimpleNamespace(args={"path": target}, id=f"{a.id}-{at}", data=None,
                               result=None)
        ckpt.run(q, stub, at - 1)  # type: ignore[arg-type]
        return str(stub.result)

    rec.step_guard = StepGuard(rules, step, a.id, audit, q.clock.optimizers, checkpoint)
    a.data = {"armed_at": step, "rules": rules}
    a.result = f"guard armed after step {step}: {describe_rules(rules)}"


def describe_rules(r: dict[str, Any]) -> str:
    if r.get("off"):
        return "off"
    parts = []
    if r.get("skip_nonfinite"):
        parts.append("skip non-finite")
    if r.get("skip_spike"):
        parts.append(f"skip loss > x{r['skip_spike']:g} median")
    if r.get("skip") is False:
        parts.append("(record only, no skip)")
    if r.get("lower_lr"):
        parts.append(f"LR x{r['lower_lr']:g} on firing")
    if r.get("checkpoint"):
        parts.append(f"checkpoint to {r['checkpoint']} before")
    return ", ".join(parts)


def _validate(fields: Fields) -> str | None:
    g = fields.get("guard")
    if not isinstance(g, dict) or not g:
        return ('guard needs {"guard": {...}}: skip_nonfinite, skip_spike K, lower_lr F, '
                "checkpoint PATH, or off")
    unknown = sorted(set(g) - set(RULES))
    if unknown:
        return f"guard: unknown rule(s) {', '.join(unknown)}; known: {', '.join(RULES)}"
    if g.get("off"):
        return None
    if not (g.get("skip_nonfinite") or g.get("skip_spike")):
        return "guard needs a rule that fires: skip_nonfinite and/or skip_spike K"
    k = g.get("skip_spike")
    if k is not None and (not isinstance(k, (int, float)) or not math.isfinite(k) or k <= 1):
        return f"guard skip_spike must be a number above 1, not {k!r}"
    f = g.get("lower_lr")
    if f is not None and (not isinstance(f, (int, float)) or not 0 < f < 1):
        return f"guard lower_lr must be a factor between 0 and 1, not {f!r}"
    p = g.get("checkpoint")
    if p is not None and (not isinstance(p, str) or not os.path.isabs(p)):
        return f"guard checkpoint must be an absolute directory path, not {p!r}"
    return None


def _check(q: ActionQueue, args: dict[str, Any]) -> None:
    from ...errors import AgentStateError

    if q.numerics() is None:
        raise AgentStateError("the numerics recorder is not running on this rank: no guard")


KIND = ActionKind("guard", run, describe=lambda f: "guard " + describe_rules(f.get("guard") or {}),
                  validate=_validate, check=_check,
                  args=lambda f: {"guard": dict(f.get("guard") or {})})
