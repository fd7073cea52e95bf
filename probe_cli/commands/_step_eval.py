"""`probe eval --at-step N | --next-step CODE`: eval as a step-boundary action."""

from __future__ import annotations

from probe_protocol.actions import ActionRequest, FinishedAction

from ..outcome import Outcome
from ..render.text import render_eval, render_eval_failures
from ..transport.session import Session
from ..transport.step_actions import run_step_action
from ._step_options import step_outcome


def step_eval(session: Session, code: str, at_step: int | None, wait_s: float) -> Outcome:
    so = run_step_action(session, ActionRequest(kind="step-eval", code=code), at_step=at_step,
                         wait_s=wait_s)
    many = len(so.results) > 1
    return step_outcome(
        session, so,
        lambda ok: render_eval(ok, session.colour),
        # Only ranks whose code raised show a traceback; the rest are in the summary.
        render_failed=lambda failed: render_eval_failures(
            [r for r in failed if FinishedAction.from_wire(r.data).state == "error"],
            session.colour,
            labels=many,
        ),
    )
