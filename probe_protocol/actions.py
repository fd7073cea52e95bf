"""The bodies of the step-boundary routes: the step clock, actions, resume, profile windows and
flame sessions (docs/http-api.md, "Step-boundary actions", "Profiling").

An action, a profile window and a flame session travel as the agent describes them (dicts whose
keys the page lists): renderers walk them as mappings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .envelope import Body, WireBody, as_dict, as_int, as_str, sometimes


@dataclass(frozen=True, slots=True)
class StepBody(WireBody):
    """``GET /v1/step``: where the rank's step clock is. ``step`` is None before the first
    optimizer step; ``paused_at`` is the step a ``pause`` action holds the training thread at."""

    rank: int | None
    step: int | None = None
    seen_step: bool | None = None
    armed: bool | None = None
    torch: bool | None = None
    numbering: str | None = None
    armed_at: float | None = None
    last_step_at: float | None = None
    optimizers: tuple[str, ...] = ()
    skipped: int | None = None
    paused_at: int | None = None
    pending: int | None = None
    action_timeout_s: float | None = None
    now: float | None = None


@dataclass(frozen=True, slots=True)
class ActionBody(WireBody):
    """``POST /v1/actions``, ``GET|DELETE /v1/actions/{id}``: the rank's step and one action
    (``action`` is None when the answer carried none: a refusal's error body). ``reason`` is
    read from a 409 refusal (``past``, ``duplicate``, ``running``, ``no-step-hook``)."""

    rank: int | None
    step: int | None = None
    paused_at: int | None = None
    action: dict[str, Any] | None = None
    reason: str | None = sometimes()

    @property
    def state(self) -> str | None:
        return (self.action or {}).get("state")


@dataclass(frozen=True, slots=True)
class ActionListBody(WireBody):
    """``GET /v1/actions``: queued, running and the last finished actions of one rank."""

    rank: int | None
    step: int | None = None
    paused_at: int | None = None
    actions: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class FinishedAction:
    """A step-boundary action's final state as the CLI keeps it per rank: the ``action`` of an
    ActionBody with the rank and the step it was at (``current_step``). ``data`` is the
    built-in action's report (lr, checkpoint, pause)."""

    rank: int | None
    state: str | None = None
    current_step: int | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {"rank": self.rank, "state": self.state, "current_step": self.current_step,
                "data": self.data}

    @classmethod
    def from_wire(cls, body: Body | None) -> FinishedAction:
        b = body or {}
        return cls(rank=as_int(b.get("rank")), state=as_str(b.get("state")),
                   current_step=as_int(b.get("current_step")), data=as_dict(b.get("data")))


@dataclass(frozen=True, slots=True)
class ResumeRequest:
    """What ``POST /v1/resume`` takes: who asked, for the audit row."""

    requested_by: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"requested_by": self.requested_by}

    @classmethod
    def from_wire(cls, body: Body | None) -> ResumeRequest:
        return cls(as_str((body or {}).get("requested_by")))


@dataclass(frozen=True, slots=True)
class ResumeBody(WireBody):
    """``POST /v1/resume``: the step the thread was held at, the pauses not reached yet that
    were cancelled, and the current step."""

    rank: int | None
    was_paused_at: int | None = None
    cancelled: tuple[str, ...] = ()
    note: str | None = None
    step: int | None = None


@dataclass(frozen=True, slots=True)
class ProfileBody(WireBody):
    """``GET /v1/profile/{id}``: the rank's step, its clock, and the window's description."""

    rank: int | None
    step: int | None = None
    now: float | None = None
    profile: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FlameBody(WireBody):
    """``POST /v1/flame``, ``GET /v1/flame/{id}``: the rank's step and the session's
    description (its ``folded`` stacks once done)."""

    rank: int | None
    step: int | None = None
    flame: dict[str, Any] = field(default_factory=dict)
