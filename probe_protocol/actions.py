"""The bodies of the step-boundary routes: the step clock, actions, resume, profile windows and
flame sessions (docs/http-api.md, "Step-boundary actions", "Profiling").

An action, a profile window and a flame session travel as the agent describes them (dicts whose
keys the page lists): renderers walk them as mappings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .envelope import (
    Body,
    WireBody,
    as_bool,
    as_dict,
    as_dict_or_none,
    as_dicts,
    as_float,
    as_int,
    as_str,
    as_strs,
    sometimes,
)


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

    @classmethod
    def from_wire(cls, body: Body | None) -> StepBody:
        b = body or {}
        return cls(rank=as_int(b.get("rank")), step=as_int(b.get("step")),
                   seen_step=as_bool(b.get("seen_step")), armed=as_bool(b.get("armed")),
                   torch=as_bool(b.get("torch")), numbering=as_str(b.get("numbering")),
                   armed_at=as_float(b.get("armed_at")),
                   last_step_at=as_float(b.get("last_step_at")),
                   optimizers=as_strs(b.get("optimizers")), skipped=as_int(b.get("skipped")),
                   paused_at=as_int(b.get("paused_at")), pending=as_int(b.get("pending")),
                   action_timeout_s=as_float(b.get("action_timeout_s")),
                   now=as_float(b.get("now")))


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

    @classmethod
    def from_wire(cls, body: Body | None) -> ActionBody:
        b = body or {}
        return cls(rank=as_int(b.get("rank")), step=as_int(b.get("step")),
                   paused_at=as_int(b.get("paused_at")), action=as_dict_or_none(b.get("action")),
                   reason=as_str(b.get("reason")))

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

    @classmethod
    def from_wire(cls, body: Body | None) -> ActionListBody:
        b = body or {}
        return cls(rank=as_int(b.get("rank")), step=as_int(b.get("step")),
                   paused_at=as_int(b.get("paused_at")), actions=as_dicts(b.get("actions")))


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

    @classmethod
    def from_wire(cls, body: Body | None) -> ResumeBody:
        b = body or {}
        return cls(rank=as_int(b.get("rank")), was_paused_at=as_int(b.get("was_paused_at")),
                   cancelled=as_strs(b.get("cancelled")), note=as_str(b.get("note")),
                   step=as_int(b.get("step")))


@dataclass(frozen=True, slots=True)
class ProfileBody(WireBody):
    """``GET /v1/profile/{id}``: the rank's step, its clock, and the window's description."""

    rank: int | None
    step: int | None = None
    now: float | None = None
    profile: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, body: Body | None) -> ProfileBody:
        b = body or {}
        return cls(rank=as_int(b.get("rank")), step=as_int(b.get("step")),
                   now=as_float(b.get("now")), profile=as_dict(b.get("profile")))


@dataclass(frozen=True, slots=True)
class FlameBody(WireBody):
    """``POST /v1/flame``, ``GET /v1/flame/{id}``: the rank's step and the session's
    description (its ``folded`` stacks once done)."""

    rank: int | None
    step: int | None = None
    flame: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, body: Body | None) -> FlameBody:
        b = body or {}
        return cls(rank=as_int(b.get("rank")), step=as_int(b.get("step")),
                   flame=as_dict(b.get("flame")))
