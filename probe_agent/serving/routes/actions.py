"""Step-boundary action routes: step, actions (queue, list, wait, cancel), resume.

Queueing runs code on the training thread, so it follows /v1/eval's policy: off loopback it
needs a token (the unix socket is always allowed). Nothing here blocks the event loop: submit
runs in a worker thread (it checks a checkpoint path on the filesystem), cancel only
takes the queue's lock; ``wait`` is the job table's long-poll (jobs.py).
"""

from __future__ import annotations

import math
import time
import uuid
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, BeforeValidator, Field, StrictBool, model_validator
from starlette.concurrency import run_in_threadpool

from probe_protocol import routes
from probe_protocol.actions import ActionBody, ActionListBody, ResumeBody, StepBody

from ...actions.kinds import KINDS
from ...errors import ForbiddenError
from .core import _agent, _client

if TYPE_CHECKING:
    from ..parts import AgentParts

router = APIRouter()


def _json_number(v: Any) -> Any:
    """pydantic's lax mode reads ``true`` as 1 and ``"0.5"`` as 0.5; an LR or a step must be a
    JSON number (``{"set": true}`` set every LR to 1.0)."""
    if isinstance(v, (bool, str)):
        raise ValueError(f"give a JSON number, not {type(v).__name__} {v!r}")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"give a finite number, not {v!r}")
    return v


Number = Annotated[float, BeforeValidator(_json_number)]
Integer = Annotated[int, BeforeValidator(_json_number)]


class ActionRequest(BaseModel):
    kind: str = Field(
        "step-eval", description="step-eval runs `code`; the others are built-in actions",
        json_schema_extra={"enum": list(KINDS)},
    )
    step: Integer | None = Field(
        None, ge=0, description="Run right after optimizer step N; null = this rank's next step"
    )
    code: str = Field("", description="Python source for step-eval")
    scale: Number | None = Field(None, ge=0, description="lr: multiply every LR by this (0 or "
                                 "above 10 only with force)")
    set: Number | None = Field(None, ge=0, description="lr: set every LR to this (0 or above 10x "
                               "the current largest LR only with force)")
    force: StrictBool = Field(False, description="lr: allow 0 and changes above 10x")
    path: str | None = Field(None, description="checkpoint: where to write (absolute)")
    overwrite: StrictBool = Field(False, description="checkpoint: replace an existing file (or "
                                  "sharded: an existing checkpoint directory)")
    model: str | None = Field(None, description="checkpoint: the model's name (dotted) to save")
    profile: dict[str, Any] | None = Field(
        None, description="profile: steps, max_steps, max_seconds, record_shapes, "
        "with_stack; checked by probe_agent/actions/profile.py")
    guard: dict[str, Any] | None = Field(
        None, description="guard: skip_nonfinite, skip_spike K, lower_lr F, checkpoint PATH, "
        "skip (false: record only), or off; checked by probe_agent/actions/kinds/guard.py")
    id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="Action id; the CLI sends the same one to every rank",
    )
    group: list[Integer] | None = Field(
        None, description="Ranks the action was sent to; they must all reach the step for it "
        "to run (default: every rank of the job)",
    )
    requested_by: str | None = Field(None, max_length=200, description="user@host, for audit")

    @model_validator(mode="after")
    def _check(self) -> ActionRequest:
        kind = KINDS.get(self.kind)
        if kind is None:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        problem = kind.validate(self.model_dump())
        if problem:
            raise ValueError(problem)
        return self


class ResumeRequest(BaseModel):
    requested_by: str | None = Field(None, max_length=200)


def require_eval_rights(request: Request, what: str) -> None:
    agent = _agent(request)
    if _client(request) != "unix" and not agent.config.eval_allowed:
        raise ForbiddenError(
            f"{what} refused: this agent listens on {agent.config.host} without a token. Set "
            "PROBE_TOKEN in the training job's environment and pass --token to probe"
        )


def _action(agent: AgentParts, action: Any) -> dict[str, Any]:
    return ActionBody(agent.rank, step=agent.stepclock.current_step,
                      paused_at=agent.actions.paused_at, action=action.to_wire()).to_wire()


@router.get(routes.STEP.path)
async def step(request: Request) -> dict[str, Any]:
    """This rank's step clock: ``step`` (null before the first optimizer step), ``paused_at``."""
    agent = _agent(request)
    return StepBody(agent.rank, **agent.actions.status(), now=time.time()).to_wire()


@router.get(routes.ACTIONS.path)
async def list_actions(request: Request) -> dict[str, Any]:
    agent = _agent(request)
    return ActionListBody(agent.rank, step=agent.stepclock.current_step,
                          paused_at=agent.actions.paused_at,
                          actions=tuple(a.to_wire() for a in agent.actions.actions())).to_wire()


@router.post(routes.SUBMIT_ACTION.path)
async def submit(request: Request, body: ActionRequest) -> dict[str, Any]:
    agent = _agent(request)
    require_eval_rights(request, f"{body.kind} action")
    kind, fields = KINDS[body.kind], body.model_dump()
    # In a worker thread: a checkpoint's path is checked with lstat/stat, which a hung network
    # filesystem can block for minutes; the event loop must keep answering backtraces.
    action = await run_in_threadpool(
        agent.actions.submit,
        kind=body.kind, step=body.step, code=kind.describe(fields), args=kind.args(fields),
        client=_client(request), requested_by=body.requested_by,
        action_id=body.id or uuid.uuid4().hex[:12], group=body.group,
    )
    return _action(agent, action)


@router.get(routes.ACTION.path)
async def get_action(request: Request, action_id: str, wait: float = 0.0) -> dict[str, Any]:
    """One action; ``wait=S`` holds the answer up to S seconds (≤ 30) until it has finished."""
    agent = _agent(request)
    return _action(agent, await agent.actions.jobs.wait(action_id, wait))


@router.delete(routes.CANCEL_ACTION.path)
async def cancel(request: Request, action_id: str) -> dict[str, Any]:
    """Cancel a queued action (409 while it runs: the training thread cannot be interrupted)."""
    agent = _agent(request)
    action = agent.actions.cancel(action_id, _client(request), request.headers.get("x-probe-who"))
    return _action(agent, action)


@router.post(routes.RESUME.path)
async def resume(request: Request, body: ResumeRequest) -> dict[str, Any]:
    """Release a paused training thread now (and cancel pauses not reached yet)."""
    agent = _agent(request)
    require_eval_rights(request, "resume")
    return ResumeBody(agent.rank, **agent.actions.resume(_client(request),
                                                          body.requested_by)).to_wire()
