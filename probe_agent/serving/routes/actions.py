"""Step-boundary action routes: step, actions (queue, list, wait, cancel), resume.

Queueing runs code on the training thread, so it follows /v1/eval's policy: off loopback it
needs a token (the unix socket is always allowed). Nothing here blocks the event loop: submit
runs in a worker thread (it checks a checkpoint path on the filesystem), cancel only
takes the queue's lock; ``wait`` is the job table's long-poll (jobs.py).
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from probe_protocol import routes
from probe_protocol.actions import (
    ActionBody,
    ActionListBody,
    ActionRequest,
    ResumeBody,
    ResumeRequest,
    StepBody,
)

from ...actions.kinds import KINDS
from ...errors import ForbiddenError
from .bodies import MalformedRequestError, openapi_body, read_body
from .core import _agent, _client

if TYPE_CHECKING:
    from ..parts import AgentParts

router = APIRouter()


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


@router.post(routes.SUBMIT_ACTION.path, openapi_extra=openapi_body(ActionRequest))
async def submit(request: Request) -> dict[str, Any]:
    agent = _agent(request)
    body = await read_body(request, ActionRequest, "code", agent.config.max_eval_bytes,
                           "PROBE_MAX_EVAL_BYTES")
    kind, fields = KINDS.get(body.kind), body.fields()
    if kind is None:
        raise MalformedRequestError(f"malformed request: kind: Input should be "
                                    f"{', '.join(repr(k) for k in KINDS)}")
    problem = kind.validate(fields)
    if problem:  # the kind's own arguments do not belong together
        raise MalformedRequestError(f"malformed request: Value error, {problem}")
    require_eval_rights(request, f"{body.kind} action")
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


@router.post(routes.RESUME.path, openapi_extra=openapi_body(ResumeRequest))
async def resume(request: Request) -> dict[str, Any]:
    """Release a paused training thread now (and cancel pauses not reached yet)."""
    body = await read_body(request, ResumeRequest)
    agent = _agent(request)
    require_eval_rights(request, "resume")
    return ResumeBody(agent.rank, **agent.actions.resume(_client(request),
                                                          body.requested_by)).to_wire()
