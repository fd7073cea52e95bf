"""The ``profile`` step-boundary action and the ceilings of `probe profile` and
`probe flame`.

``POST /v1/actions {"kind": "profile", "profile": {"steps": N, ...}}`` queues it like any other
action: every targeted rank agrees that it reached step S (agreement.py), then starts
torch.profiler there (profiling/window.py), which stops by itself at boundary S+N.

Ceilings (safe by default): a window longer than ``max_steps`` (default ``MAX_STEPS``) is refused
unless the request raises ``max_steps``, which is itself bounded by ``HARD_MAX_STEPS``; and the
profiler stops after ``max_seconds`` (default ``MAX_SECONDS``) of wall time whatever the steps
do, or at the first step boundary where the process has grown more than ``max_mb`` (default
``MAX_MB``) since the window began (profiling/memory.py). The same for flame graphs:
``seconds`` up to ``max_seconds`` (default ``FLAME_MAX_SECONDS``), at most
``FLAME_HARD_MAX_SECONDS``. Refusals are 400s that name the option to raise, and they
are audited like every refused action.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

from ..errors import ProbeAgentError

if TYPE_CHECKING:
    from ..profiling.sessions import Profiling
    from .queue import Action, ActionQueue

#: Profiled steps without raising --max-steps; a profiled step can cost several times a plain
#: one, and its trace tens of MB.
MAX_STEPS = 20
HARD_MAX_STEPS = 500
#: Wall-clock ceiling of a window: the profiler stops by then even if the steps never come.
MAX_SECONDS = 120.0
HARD_MAX_SECONDS = 3600.0
#: The RSS a window may add before it ends itself (profiling/memory.py), and its ceiling.
MAX_MB = 512.0
HARD_MAX_MB = 65536.0
FLAME_HARD_MAX_SECONDS = 600.0
FLAME_MAX_RATE = 1000.0


class CeilingError(ProbeAgentError, ValueError):
    """A profile or flame request over its ceiling, or malformed (HTTP 400)."""

    status = 400


def _number(args: dict[str, Any], key: str, default: float | None) -> float:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or v != v:
        raise CeilingError(f"{key} must be a number, not {v!r}")
    return float(v)


def check_profile(args: dict[str, Any]) -> dict[str, Any]:
    """Validate a profile request; returns it with its defaults filled in."""
    steps = _number(args, "steps", None)
    max_steps = _number(args, "max_steps", MAX_STEPS)
    max_seconds = _number(args, "max_seconds", MAX_SECONDS)
    max_mb = _number(args, "max_mb", MAX_MB)
    if steps != int(steps) or steps < 1:
        raise CeilingError(f"profile steps={steps:g} refused: give a whole number >= 1")
    if max_steps > HARD_MAX_STEPS:
        raise CeilingError(f"profile max_steps={max_steps:g} refused: the agent's hard limit "
                           f"is {HARD_MAX_STEPS} steps")
    if steps > max_steps:
        raise CeilingError(
            f"profile --for {steps:g} refused: above the ceiling of {max_steps:g} steps "
            f"(each profiled step costs extra time and trace size); pass --max-steps "
            f"{steps:g} to raise it")
    if not 0 < max_seconds <= HARD_MAX_SECONDS:
        raise CeilingError(f"profile max_seconds={max_seconds:g} refused: give 0 < seconds <= "
                           f"{HARD_MAX_SECONDS:g}")
    if not 0 < max_mb <= HARD_MAX_MB:
        raise CeilingError(f"profile max_mb={max_mb:g} refused: give 0 < MiB <= "
                           f"{HARD_MAX_MB:g}")
    for flag in ("record_shapes", "with_stack"):
        if not isinstance(args.get(flag, False), bool):
            raise CeilingError(f"profile {flag} must be true or false")
    return {"steps": int(steps), "max_steps": max_steps, "max_seconds": max_seconds,
            "max_mb": max_mb,
            "record_shapes": bool(args.get("record_shapes")),
            "with_stack": bool(args.get("with_stack"))}


def check_flame(seconds: float, rate: float, max_seconds: float) -> None:
    if max_seconds > FLAME_HARD_MAX_SECONDS:
        raise CeilingError(f"flame max_seconds={max_seconds:g} refused: the agent's hard limit "
                           f"is {FLAME_HARD_MAX_SECONDS:g} s")
    if seconds > max_seconds:
        raise CeilingError(
            f"flame --seconds {seconds:g} refused: above the ceiling of {max_seconds:g} s; "
            f"pass --max-seconds {seconds:g} to raise it")
    if not 0 < rate <= FLAME_MAX_RATE:
        raise CeilingError(f"flame --rate {rate:g} refused: give 0 < HZ <= {FLAME_MAX_RATE:g}")


def check_args(args: dict[str, Any], profiling: Profiling) -> None:
    """The submit-time check (queue.py): the ceilings, and no other profiler active (409)."""
    args.update(check_profile(args))
    profiling.check_free()


def run_profile(q: ActionQueue, a: Action, step: int) -> None:
    """The runner (kinds/profile.py): start the window at boundary ``step`` (training thread)."""
    a.args.update(check_profile(a.args))
    w = q.profiling.start_window(a, step)
    a.data = {"first_step": w.start_step + 1, "last_step": w.last_step,
              "activities": w.activities, "max_seconds": w.max_seconds}
    a.result = (f"profiling steps {w.start_step + 1}..{w.last_step} "
                f"({', '.join(w.activities)}; stops by itself, at the latest after "
                f"{w.max_seconds:g} s)")
