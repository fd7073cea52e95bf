"""The bodies of the step-boundary routes: the step clock, actions, resume, profile windows and
flame sessions (docs/http-api.md, "Step-boundary actions", "Profiling").

An action, a profile window and a flame session travel as the agent describes them (dicts whose
keys the page lists): renderers walk them as mappings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .envelope import Body, WireBody, as_dict, as_int, as_str, sometimes
from .requests import ID_PATTERN, Request, arg


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
class ResumeRequest(Request):
    """What ``POST /v1/resume`` takes: who asked, for the audit row."""

    requested_by: str | None = arg("str", max_length=200, description="user@host, for audit")


#: The flame ceiling the agent applies when the request names none (`probe flame --max-seconds`).
FLAME_MAX_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class ActionRequest(Request):
    """What ``POST /v1/actions`` takes: a kind of step-boundary action, the step, and the
    kind's own arguments. The agent's kind (probe_agent/actions/kinds/) checks the arguments
    belong together; keys no field here names travel in ``extra`` (a newer kind's
    arguments). A profile window's length is ``profile.ahead`` (``--for N``; an older CLI sent
    ``steps``, still read)."""

    EXTRA: ClassVar[str | None] = "extra"

    kind: str = arg("str", "step-eval",
                    description="step-eval runs `code`; the others are built-in actions")
    step: int | None = arg("int", ge=0, description="Run right after optimizer step N; null = "
                           "this rank's next step")
    code: str = arg("str", "", description="Python source for step-eval")
    scale: float | None = arg("number", ge=0, description="lr: multiply every LR by this (0 "
                              "or above 10 only with force)")
    set: float | None = arg("number", ge=0, description="lr: set every LR to this (0 or above "
                            "10x the current largest LR only with force)")
    force: bool = arg("bool", False, description="lr: allow 0 and changes above 10x")
    path: str | None = arg("str", description="checkpoint: where to write (absolute)")
    overwrite: bool = arg("bool", False, description="checkpoint: replace an existing file "
                          "(or sharded: an existing checkpoint directory)")
    model: str | None = arg("str", description="checkpoint: the model's name (dotted) to save")
    profile: dict[str, Any] | None = arg(
        "object", description="profile: ahead, max_steps, max_seconds, max_mb, record_shapes, "
        "with_stack; checked by probe_agent/actions/profile.py")
    guard: dict[str, Any] | None = arg(
        "object", description="guard: skip_nonfinite, skip_spike K, lower_lr F, checkpoint "
        "PATH, skip (false: record only), or off; checked by probe_agent/actions/kinds/guard.py")
    id: str | None = arg("str", pattern=ID_PATTERN,
                         description="Action id; the CLI sends the same one to every rank")
    group: list[int] | None = arg("ints", description="Ranks the action was sent to; they "
                                  "must all reach the step for it to run (default: every rank "
                                  "of the job)")
    requested_by: str | None = arg("str", max_length=200, description="user@host, for audit")
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FlameRequest(Request):
    """What ``POST /v1/flame`` takes: how long and how often to sample the rank's stacks."""

    seconds: float = arg("number", 10.0, gt=0, description="How long to sample")
    rate: float = arg("number", 100.0, gt=0, description="Samples per second")
    max_seconds: float = arg("number", FLAME_MAX_SECONDS, gt=0,
                             description="Ceiling; seconds above it are refused")
    sampler: str = arg("str", "auto", choices=("auto", "py-spy", "in-process"),
                       description="py-spy record --nonblocking (auto: when it can read this "
                       "process), or the in-process sampler")
    id: str | None = arg("str", pattern=ID_PATTERN,
                         description="Session id; the CLI sends the same one to every rank")
    requested_by: str | None = arg("str", max_length=200)


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
