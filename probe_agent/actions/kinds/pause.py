"""``pause``: hold the training thread after step N until ``probe resume`` (queue.py holds it;
actions queued for step N still run there meanwhile)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import ActionKind

if TYPE_CHECKING:
    from ..queue import Action, ActionQueue


def run(q: ActionQueue, a: Action, step: int) -> None:
    q.hold_at(step)
    a.data = {"paused_at": step}
    a.result = f"held after step {step}"


KIND = ActionKind("pause", run, describe=lambda _: "pause")
