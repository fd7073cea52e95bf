"""What the step-boundary action commands (`eval --at-step/--next-step`, `lr`, `checkpoint`,
`pause`) share besides the protocol (transport/step_actions.py): their options, and the
StepOutcome -> Outcome step that adds where the action ran to the usual summary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..errors import EXIT_USAGE, ProbeCLIError
from ..outcome import Outcome, finish
from ..render.actions import render_step_header
from ..result import RankResult
from ..transport.session import Session
from ..transport.step_actions import StepOutcome

Render = Callable[[list[RankResult]], list[str]]


def check_exclusive(at_step: int | None, next_step: bool) -> None:
    if at_step is not None and next_step:
        raise ProbeCLIError("give --at-step N or --next-step, not both", exit_code=EXIT_USAGE)


def step_outcome(session: Session, so: StepOutcome, render_ok: Render,
                 render_failed: Render | None = None) -> Outcome:
    """StepOutcome -> the shared Outcome (exit code, failure summary), plus where it ran."""
    out = finish(session, so.results, render_ok, render_failed=render_failed)
    out.stderr[:0] = render_step_header(so) + so.notes
    return out


def wait_option(fn: Any) -> Any:
    return click.option(
        "--wait", "wait_s", type=click.FloatRange(min=0, min_open=True), default=120.0,
        show_default=True, metavar="SECONDS",
        help="How long to wait for every rank to reach the step and finish. Ranks that have "
             "not got there by then have the action cancelled (it then runs on no rank).",
    )(fn)


def at_step_option(fn: Any, default: str = "the next step (the smallest step no rank has "
                                            "passed yet)") -> Any:
    return click.option(
        "--at-step", type=click.IntRange(min=0), default=None, metavar="N",
        help=f"Run right after optimizer step N on every rank. Default: {default}.",
    )(fn)


def at_step_or_now_option(fn: Any) -> Any:
    """``--at-step`` of a command that, without it, runs at once (``eval``)."""
    return at_step_option(fn, "neither: the code runs at once, beside the training thread "
                              "(mid-step), not at a step boundary")
