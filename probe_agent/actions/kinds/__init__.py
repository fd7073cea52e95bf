"""The kinds of step-boundary action, one module each (datasette's default plugins): a module
ends in ``KIND = ActionKind(...)`` (base.py) and ``DEFAULT_KINDS`` lists it. The queue runs and
checks actions through ``KINDS``; the route validates and describes requests through it.

Adding a kind: one module here, one line in ``DEFAULT_KINDS``; its request travels in
probe_protocol's ``ActionRequest`` and the CLI builds it with the same class.
"""

from __future__ import annotations

from . import checkpoint, guard, lr, pause, profile, step_eval
from .base import ActionKind

DEFAULT_KINDS = (step_eval, lr, checkpoint, pause, profile, guard)

#: Every kind by name, in ``DEFAULT_KINDS`` order.
KINDS: dict[str, ActionKind] = {m.KIND.name: m.KIND for m in DEFAULT_KINDS}

__all__ = ["KINDS", "ActionKind"]
