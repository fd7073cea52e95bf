"""``profile``: a torch.profiler window from step N (actions/profile.py checks the ceilings,
profiling/window.py runs it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import ActionKind, Fields

if TYPE_CHECKING:
    from ..queue import Action, ActionQueue


def run(q: ActionQueue, a: Action, step: int) -> None:
    from ..profile import run_profile

    run_profile(q, a, step)


def _check(q: ActionQueue, args: dict[str, Any]) -> None:
    from ..profile import check_args  # the ceilings, and no other profiler active

    check_args(args, q.profiling)


def _describe(fields: Fields) -> str:
    return "profile " + " ".join(f"{k}={v}" for k, v in sorted((fields.get("profile") or {})
                                                               .items()))


def _args(fields: Fields) -> dict[str, Any]:
    """The window's settings; its length is ``ahead`` on the wire (``--for N``), ``steps``
    here (and on the wire from a CLI older than that spelling)."""
    args = dict(fields.get("profile") or {})
    if "ahead" in args:
        args["steps"] = args.pop("ahead")
    return args


KIND = ActionKind(
    "profile", run, describe=_describe, check=_check,
    validate=lambda f: None if f.get("profile") else "profile needs profile: {\"steps\": N}",
    args=_args)
