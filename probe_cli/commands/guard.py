"""`probe guard`: arm (or disarm) the step guard on every rank at the same step boundary: skip the
optimizer step when the loss or gradients are NaN/Inf or the loss spikes, optionally lowering
the LR and saving a checkpoint first (probe_agent/actions/guard.py)."""

from __future__ import annotations

import os
from typing import Any

import click

from probe_protocol.actions import ActionRequest, FinishedAction

from ..errors import EXIT_USAGE, ProbeCLIError
from ..group import rank_label
from ..outcome import Outcome
from ..result import RankResult
from ..transport.session import Session
from ..transport.step_actions import run_step_action
from . import pass_session
from ._step_options import at_step_option, step_outcome, wait_option


@click.command("guard")
@click.option("--skip-nonfinite", is_flag=True,
              help="Skip the optimizer step when the loss or the gradient norm is NaN/Inf.")
@click.option("--skip-spike", type=click.FloatRange(min=1, min_open=True), default=None,
              metavar="K", help="Skip the optimizer step when the loss is above K x the "
                                "median of the last 50 steps.")
@click.option("--lower-lr", type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
              default=None, metavar="F", help="When the guard fires, also multiply every LR "
                                              "by F (schedulers rescaled too).")
@click.option("--checkpoint", "ckpt", default=None, metavar="DIR",
              help="When the guard fires, first save a checkpoint (the weights before the bad "
                   "step) to DIR/guard-step<N> (as `probe checkpoint`).")
@click.option("--record-only", is_flag=True,
              help="Record (and checkpoint, lower the LR) when a rule holds, but let the step "
                   "run.")
@click.option("--off", is_flag=True, help="Disarm the guard.")
@at_step_option
@wait_option
@pass_session
def command(session: Session, skip_nonfinite: bool, skip_spike: float | None,
            lower_lr: float | None, ckpt: str | None, record_only: bool, off: bool,
            at_step: int | None, wait_s: float) -> Outcome:
    """Arm the step guard on every rank, from the same step on: before every optimizer step
    the rules are checked on the step's loss and total gradient norm (recorded with no code
    change); when one holds on any rank, the ranks agree (one all_reduce of a flag per step
    while armed) and every rank skips that optimizer step: weights and optimizer state stay
    bit-identical. Every firing is recorded in python.audit (kind 'guard') and shown by
    `probe doctor` and `probe numerics`. --off disarms it. Not for DeepSpeed's engine (ZeRO
    keeps the gradients in its own partitions).
    """
    if off and (skip_nonfinite or skip_spike or lower_lr or ckpt or record_only):
        raise ProbeCLIError("guard --off takes no rules", exit_code=EXIT_USAGE)
    if not off and not (skip_nonfinite or skip_spike):
        raise ProbeCLIError("guard needs a rule: --skip-nonfinite and/or --skip-spike K (or "
                            "--off)", exit_code=EXIT_USAGE)
    rules: dict[str, Any] = {"off": True} if off else {}
    if skip_nonfinite:
        rules["skip_nonfinite"] = True
    if skip_spike is not None:
        rules["skip_spike"] = skip_spike
    if lower_lr is not None:
        rules["lower_lr"] = lower_lr
    if ckpt:
        rules["checkpoint"] = os.path.abspath(os.path.expanduser(ckpt))
    if record_only:
        rules["skip"] = False
    so = run_step_action(session, ActionRequest(kind="guard", guard=rules), at_step=at_step,
                         wait_s=wait_s)
    return step_outcome(session, so, _render)


def _render(ok: list[RankResult]) -> list[str]:
    lines: dict[str, list[int]] = {}
    for r in ok:
        d = FinishedAction.from_wire(r.data).data
        if "disarmed_at" in d:
            text = f"guard off after step {d['disarmed_at']} (it fired {d.get('fired', 0)} times)"
        else:
            rules = d.get("rules") or {}
            text = f"guard armed after step {d.get('armed_at')}: " + ", ".join(
                f"{k}={v}" for k, v in rules.items())
        lines.setdefault(text, []).append(r.rank if r.rank is not None else -1)
    return [f"{rank_label(ranks)}: {text}" for text, ranks in lines.items()]
