"""Doctor routes: the live training-loop state `probe doctor` needs, eval-free.

``GET /v1/doctor`` answers without touching the training thread: the step clock, a DataLoader
wait in progress, the optimizers' param-group settings (lr, momentum, weight decay, ...) and, on
CUDA, the total memory of the devices in use. ``POST /v1/doctor/grads`` arms a one-shot
gradient check at the next optimizer step (see ``collectors/trainloop.py``) and waits for it.
Neither runs user code, so both work where eval is refused (off loopback without a token).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Query, Request

from probe_protocol import routes
from probe_protocol.bodies import DoctorBody, GradsBody, NumericsBody, NumericsRequest

from ...collectors.trainloop import optimizer_state
from ...errors import AgentStateError, ConfigError
from ...jsonsafe import jsonable
from .bodies import openapi_body, read_body

if TYPE_CHECKING:
    from ..parts import AgentParts

router = APIRouter()


def _cuda_totals() -> dict[str, float]:
    """MiB of each device this process has touched; never creates a CUDA context."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return {}
    out = {}
    for i in range(cuda.device_count()):
        # get_device_properties reads cached properties: no context, no synchronisation.
        out[f"cuda:{i}"] = round(cuda.get_device_properties(i).total_memory / 2**20, 1)
    return out


def _state(agent: AgentParts) -> dict[str, Any]:
    monitor = agent.collectors.trainloop
    clock = agent.stepclock
    clock.poll()
    return jsonable(DoctorBody(
        agent.rank,
        now=time.time(),
        clock=clock.state(),
        loop=monitor.state() if monitor is not None else None,
        optimizers=tuple(optimizer_state(clock.optimizers(), clock.step_lrs)),
        schedulers=_schedulers(clock.optimizers()),
        cuda_total_mib=_cuda_totals(),
        deepspeed=_deepspeed(clock.optimizers()),
        numerics=_numerics(agent),
    ).to_wire())


def _numerics(agent: AgentParts) -> dict[str, Any] | None:
    rec = agent.collectors.numerics
    return rec.state() if rec is not None else None


@router.get(routes.NUMERICS.path)
async def numerics(request: Request) -> dict[str, Any]:
    """The numerics recorder's state: ``thresholds`` (what doctor and `probe numerics` judge
    by), ``last`` (the last step's loss, gradient norm, spike factor, non-finite flag),
    ``first_nonfinite`` (the first non-finite step and where the re-run found it born),
    ``anomalies``, ``loss_source``, ``guard`` (armed rules and firings)."""
    agent = request.app.state.agent
    return jsonable(NumericsBody(agent.rank, _numerics(agent)).to_wire())


@router.post(routes.SET_NUMERICS.path, openapi_extra=openapi_body(NumericsRequest))
async def set_numerics(request: Request) -> dict[str, Any]:
    """Change thresholds while the job runs: ``{"thresholds": {"spike_factor": 3}}``. An
    unknown name or a value that is not a finite number >= 0 is a 400 naming it."""
    agent = request.app.state.agent
    rec = agent.collectors.numerics
    if rec is None:
        raise AgentStateError("the numerics recorder is not running on this rank")
    values = (await read_body(request, NumericsRequest)).thresholds
    if not values:
        raise ConfigError('give {"thresholds": {NAME: VALUE, ...}}')
    try:
        rec.set_thresholds({str(k): float(v) for k, v in values.items()})
    except KeyError as e:
        raise ConfigError(f"unknown threshold {e.args[0]!r}; known: "
                          f"{', '.join(sorted(rec.thresholds))}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"threshold refused: {e}") from None
    agent.audit(_client(request), f"numerics thresholds {values}", "ok", None, 0.0)
    return jsonable(NumericsBody(agent.rank, rec.state()).to_wire())


def _client(request: Request) -> str:
    peer = request.client
    return f"{peer.host}:{peer.port}" if peer is not None else "?"


def _schedulers(optimizers: list[Any]) -> tuple[str, ...] | None:
    """The class names of the LR schedulers of the stepping optimizers (framework discovery,
    wrappers off), so doctor can tell a loop that sets its own LR each step (nanoGPT's
    ``get_lr``: `probe lr` is undone there) from a scheduled one. None before any step.
    Discovery's gc scan is cached (frameworks/discovery.py), so repeated doctors are cheap."""
    if not optimizers:
        return None
    from ...frameworks.discovery import discover

    return tuple(type(s).__name__ for s in discover(optimizers=optimizers).schedulers)


def _deepspeed(optimizers: list[Any]) -> dict[str, Any] | None:
    """The DeepSpeed engine's clipping, loss scaler and accumulation, when one runs the job
    (its clipping never calls clip_grad_norm_, which the loop monitor watches)."""
    if "deepspeed" not in sys.modules or not optimizers:
        return None
    from ...frameworks import deepspeed, discover

    engine = deepspeed.engine_of(discover(optimizers=optimizers).trainer)
    return deepspeed.settings(engine) if engine is not None else None


@router.get(routes.DOCTOR.path)
async def doctor(request: Request) -> dict[str, Any]:
    """This rank's training-loop state for `probe doctor` (no user code runs)."""
    agent = request.app.state.agent
    return await asyncio.get_running_loop().run_in_executor(agent.query_pool, _state, agent)


@router.post(routes.DOCTOR_GRADS.path)
async def grads(
    request: Request,
    wait: float = Query(2.0, ge=0, le=10, description="seconds to wait for the next step"),
) -> dict[str, Any]:
    """Check every gradient for NaN/Inf right after the next optimizer step: ``checked``,
    ``step``, ``params``, ``without_grad``, ``nonfinite`` (parameters whose gradient has a NaN
    or Inf), ``norm`` (total norm of the finite ones); or ``checked: false`` and ``reason``."""
    agent = request.app.state.agent
    monitor = agent.collectors.trainloop
    if monitor is None:
        body: dict[str, Any] = {"checked": False, "reason": "the loop monitor is not running"}
    else:
        body = await asyncio.get_running_loop().run_in_executor(
            agent.query_pool, monitor.request_grad_check, wait)
    return jsonable(GradsBody(agent.rank, **body).to_wire())
