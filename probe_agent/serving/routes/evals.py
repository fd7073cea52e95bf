"""Evals as jobs: list, long-poll and cancel (jobs.py's route shape, as for actions).

``POST /v1/eval`` (core.py) answers when its eval ends, or when PROBE_EVAL_TIMEOUT_S has
cancelled it; an eval that did not stop then (blocked in a C call, or catching every
exception) stays here as ``running`` until it does, with its cost to the training steps.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from probe_protocol import routes
from probe_protocol.bodies import EvalJobBody, EvalListBody

from .actions import require_eval_rights
from .core import _agent, _client

router = APIRouter()


def _wire(agent: Any, job: Any) -> dict[str, Any]:
    body = job.to_wire()
    body["still_running"] = job.still_running
    if job.still_running:  # the cost so far, measured now
        body["cost"] = agent.evaluator.cost_of(job)
    return body


@router.get(routes.EVALS.path)
async def list_evals(request: Request) -> dict[str, Any]:
    """This rank's evals: running ones, and the last finished ones."""
    agent = _agent(request)
    return EvalListBody(agent.rank, tuple(_wire(agent, j) for j in agent.evaluator.jobs)).to_wire()


@router.get(routes.EVAL_JOB.path)
async def get_eval(request: Request, eval_id: str, wait: float = 0.0) -> dict[str, Any]:
    """One eval; ``wait=S`` holds the answer up to S seconds (≤ 30) until it has ended."""
    agent = _agent(request)
    job = await agent.evaluator.jobs.wait(eval_id, wait)
    return EvalJobBody(agent.rank, _wire(agent, job)).to_wire()


@router.delete(routes.CANCEL_EVAL.path)
async def cancel_eval(request: Request, eval_id: str) -> dict[str, Any]:
    """Cancel a running eval: every further line of it raises. Answers after it stopped, or
    after a second with ``still_running`` true (blocked in a C call)."""
    agent = _agent(request)
    require_eval_rights(request, "eval cancel")
    client = _client(request)
    agent.evaluator.jobs.get(eval_id)  # a 404 at once
    job = await run_in_threadpool(agent.evaluator.cancel, eval_id, client)
    agent.audit(client, f"cancel {eval_id}", "cancelled" if job.finished else "cancel-sent",
                job.error, 0.0)
    return EvalJobBody(agent.rank, _wire(agent, job)).to_wire()
