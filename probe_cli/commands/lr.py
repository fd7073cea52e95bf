"""`probe lr --scale F | --set LR`: change every optimizer's LR at the same step on every rank.

Refused here, before any request: a value that is not a finite number (``nan``,
``inf``, ``1e400``: JSON cannot even carry them), a negative one, and without ``--force`` zero
or a scale above 10. The agents refuse the same, and a ``--set`` above 10x the current largest
LR (only they know it), at submit time and again at the step boundary.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import click

from probe_protocol.actions import ActionBody, ActionRequest, FinishedAction

from ..errors import EXIT_FAILURE, EXIT_USAGE, ProbeCLIError
from ..group import rank_label
from ..outcome import Outcome
from ..render.actions import render_lr
from ..result import RankResult
from ..transport.client import ProbeClient
from ..transport.fanout import calling_live, fan_out, resolve_ranks
from ..transport.session import Session
from ..transport.step_actions import run_step_action
from . import pass_session
from ._step_options import at_step_option, step_outcome, wait_option

#: The agents' bound (probe_agent/lr.py MAX_FACTOR): more than this times the current LR
#: needs --force.
MAX_FACTOR = 10.0
_FORCE = "pass --force if you mean it"


class LearningRate(click.ParamType):
    """A finite, non-negative float; anything else is one line and exit code 2, not a
    traceback (``float("nan")`` passes click's FloatRange, then breaks JSON encoding)."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        flag = param.opts[0] if param is not None and param.opts else "value"
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ProbeCLIError(f"lr {flag} {value!r} refused: give a number",
                                exit_code=EXIT_USAGE) from None
        if not math.isfinite(number):
            raise ProbeCLIError(f"lr {flag} {value} refused: give a finite number > 0 (nan, inf "
                                "and values beyond 1.8e308 are not learning rates)",
                                exit_code=EXIT_USAGE)
        if number < 0:
            raise ProbeCLIError(f"lr {flag} {value} refused: a learning rate cannot be "
                                "negative; give a number > 0", exit_code=EXIT_USAGE)
        return number


@click.command("lr")
@click.option("--scale", type=LearningRate(), default=None, metavar="F",
              help="Multiply every learning rate by this (0.1 = ten times lower). Above 10 "
                   "needs --force.")
@click.option("--set", "set_to", type=LearningRate(), default=None, metavar="LR",
              help="Set every learning rate to this value. Above 10x the current largest LR "
                   "needs --force.")
@click.option("--force", is_flag=True,
              help="Allow an LR of 0 and changes above 10x the current LR (still refused: "
                   "nan, inf, negative, and LRs the parameters' dtype cannot hold).")
@at_step_option
@wait_option
@pass_session
def command(session: Session, scale: float | None, set_to: float | None, force: bool,
            at_step: int | None, wait_s: float) -> Outcome:
    """Change the learning rate of every param group of every optimizer, on every rank, right
    after the same optimizer step. The optimizers and schedulers are those the framework really
    uses (HF Trainer, Lightning, Accelerate, or a plain loop). LR schedulers are rescaled too
    (base LRs and the like), and each one's next step is simulated first: if it would put the
    old LR back, nothing changes and the command says why. Prints the LR before and after per
    rank.
    """
    if (scale is None) == (set_to is None):
        raise click.UsageError("give exactly one of --scale F or --set LR")
    flag, value = ("--scale", scale) if scale is not None else ("--set", set_to)
    if value == 0 and not force:
        raise ProbeCLIError(f"lr {flag} 0 refused: an LR of 0 stops training and schedulers "
                            "cannot scale it back; " + _FORCE, exit_code=EXIT_USAGE)
    if scale is not None and scale > MAX_FACTOR and not force:
        raise ProbeCLIError(f"lr --scale {scale:g} refused: more than {MAX_FACTOR:g}x the "
                            "current LR; " + _FORCE, exit_code=EXIT_USAGE)
    body = ActionRequest(kind="lr", scale=scale, set=set_to if scale is None else None,
                         force=force)
    so = run_step_action(session, body, at_step=at_step, wait_s=wait_s)
    watched = [r for r in so.results
               if r.ok and FinishedAction.from_wire(r.data).data.get("watch_next_step")]
    seen, missing = _next_step(session, so.action_id, watched,
                               min(wait_s, NEXT_STEP_WAIT_S)) if watched else ({}, [])
    for r in watched:  # --json carries the answer in each rank's report
        if r.rank in seen and isinstance(r.data, dict) and isinstance(r.data.get("data"), dict):
            r.data["data"]["next_step"] = seen[r.rank]
    out = step_outcome(session, so, lambda ok: render_lr(ok, session.colour) + _notes(ok))
    if session.output != "json":
        out.stdout += _held_lines(seen, missing, min(wait_s, NEXT_STEP_WAIT_S))
    if any(not v.get("held") for v in seen.values()):
        out.exit_code = EXIT_FAILURE  # the command could not do what it says
    return out


#: How long `probe lr` waits for the step after the change, when no scheduler was simulated.
NEXT_STEP_WAIT_S = 30.0


def _next_step(session: Session, action_id: str, watched: list[RankResult],
               wait_s: float) -> tuple[dict[int | None, dict[str, Any]], list[int | None]]:
    """No scheduler steps these optimizers: the agents look at the next step (a loop that sets
    the LR itself, like nanoGPT's get_lr, has put its own value back by then). Wait for their
    answers: ``({rank: {step, held, lrs}}, ranks that gave none within wait_s)``."""
    want = {r.rank for r in watched}
    targets = [t for t in resolve_ranks(session) if t.rank in want and t.error is None]
    seen: dict[int | None, dict[str, Any]] = {}
    deadline = time.monotonic() + wait_s
    while targets and time.monotonic() < deadline:
        for r in fan_out(session, targets, calling_live(ProbeClient.action, action_id)):
            action = ActionBody.from_wire(r.data).action if r.ok else None
            nxt = ((action or {}).get("data") or {}).get("next_step")
            if nxt:
                seen[r.rank] = nxt
        targets = [t for t in targets if t.rank not in seen]
        if targets:
            time.sleep(0.2)
    return seen, [t.rank for t in targets]


def _held_lines(seen: dict[int | None, dict[str, Any]], missing: list[int | None],
                wait_s: float) -> list[str]:
    held = [k for k, v in seen.items() if v.get("held")]
    lines = []
    if held:
        step = max(int(seen[k]["step"]) for k in held)
        lines.append(f"held: step {step} ran with the new LR on {rank_label(held)}")
    same: dict[tuple[int, str], list[int | None]] = {}  # identical answers on one line
    for k, v in seen.items():
        if not v.get("held"):
            lrs = ", ".join(f"{x:.6g}" for x in v.get("lrs") or [])
            same.setdefault((int(v["step"]), lrs), []).append(k)
    for (step, lrs), ranks in sorted(same.items()):
        lines.append(f"undone on {rank_label(ranks)}: step {step} ran with lr {lrs}, which the "
                     "training loop set itself (no scheduler does); change what the loop reads "
                     "with probe eval (e.g. the variable its get_lr uses)")
    if missing:
        lines.append(f"not known yet on {rank_label(missing)}: no step finished within "
                     f"{wait_s:g} s; `probe actions` shows it later")
    return lines


def _notes(results: Sequence[RankResult]) -> list[str]:
    """The framework the agents found the objects in, and their notes (no scheduler: the
    loop may set the LR itself), each line once."""
    datas = [FinishedAction.from_wire(r.data).data for r in results]
    frameworks = sorted({str(d["framework"]) for d in datas if d.get("framework")})
    lines = [f"framework: {', '.join(frameworks)}"] if frameworks else []
    for d in datas:
        lines += [n for n in d.get("notes") or [] if n not in lines]
    return lines
