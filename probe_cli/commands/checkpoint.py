"""`probe checkpoint PATH`: model, optimizer, scheduler, RNG and step, at one step boundary."""

from __future__ import annotations

import click

from ..outcome import Outcome
from ..render_actions import render_checkpoint
from ..session import Session
from ..steps import at_step_option, run_step_action, step_outcome, wait_option
from . import pass_session


@click.command("checkpoint")
@click.argument("path")
@click.option("--model", "model_name", default=None, metavar="NAME",
              help="The model to save, by its name in the training script (dotted names like "
                   "trainer.model work). Default: the module that owns the optimizers' "
                   "parameters.")
@at_step_option
@wait_option
@pass_session
def command(session: Session, path: str, model_name: str | None, at_step: int | None,
            wait_s: float) -> Outcome:
    """Save a consistent checkpoint right after the same optimizer step on every rank.

    PATH is a path on the ranks' machines (relative paths are relative to the training
    process's working directory). Replicated models (DDP, one process): rank 0 writes PATH with
    torch.save and every rank its RNG state to PATH.rng.rank<N>. Sharded models (FSDP, DTensor):
    torch.distributed.checkpoint writes the directory PATH. Files appear atomically (written
    under a temporary name, then renamed). Prints every file and its size.
    """
    body = {"kind": "checkpoint", "path": path}
    if model_name:
        body["model"] = model_name
    so = run_step_action(session, body, at_step=at_step, wait_s=wait_s)
    return step_outcome(session, so, lambda ok: render_checkpoint(ok, session.colour))
