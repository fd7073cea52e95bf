"""`probe checkpoint PATH`: model, optimizer, scheduler, RNG and step, at one step boundary."""

from __future__ import annotations

import os
from collections.abc import Sequence

import click

from probe_protocol.actions import ActionRequest, FinishedAction

from ..outcome import Outcome
from ..render.actions import render_checkpoint
from ..result import RankResult
from ..transport.session import Session
from ..transport.step_actions import run_step_action
from . import pass_session
from ._step_options import at_step_option, step_outcome, wait_option


def resolve(path: str) -> tuple[str, str]:
    """(absolute path, the stderr line that says which one is used and why).

    Resolved here, against the operator's working directory: the agents refuse a relative
    path, since nobody at the CLI knows the training job's working directory."""
    absolute = os.path.abspath(os.path.expanduser(path))
    if absolute == path:
        return absolute, f"probe: checkpoint path {absolute}"
    return absolute, (f"probe: checkpoint path {absolute} ({path} resolved against this "
                      "shell's working directory)")


@click.command("checkpoint")
@click.argument("path")
@click.option("--model", "model_name", default=None, metavar="NAME",
              help="The model to save, by its name in the training script (dotted names like "
                   "trainer.model work). Default: the module that owns the optimizers' "
                   "parameters.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing checkpoint file (sharded: an existing checkpoint "
                   "directory). Devices, FIFOs, sockets and other directories are never "
                   "replaced.")
@at_step_option
@wait_option
@pass_session
def command(session: Session, path: str, model_name: str | None, overwrite: bool,
            at_step: int | None, wait_s: float) -> Outcome:
    """Save a consistent checkpoint right after the same optimizer step on every rank.

    The model, optimizers and schedulers are those the framework really uses (under the HF
    Trainer the torch optimizer inside trainer.optimizer and trainer.lr_scheduler; under
    Lightning trainer.optimizers and lr_scheduler_configs), so they load back into a fresh
    setup of the same framework. PATH is a path on the ranks' machines; a relative one is
    resolved against this shell's working directory (the absolute path used is printed).
    Replicated models (DDP, one process): rank 0 writes PATH with torch.save and every rank
    its RNG state to PATH.rng.rank<N>. Sharded models (FSDP, DTensor):
    torch.distributed.checkpoint writes the directory PATH. An existing PATH is refused unless
    --overwrite; only regular files (or a new directory) are ever written. Files appear
    atomically (written under a temporary name, then renamed). On a full disk nothing is
    written and the size needed is said. Prints every file and its size.
    """
    absolute, said = resolve(path)
    body = ActionRequest(kind="checkpoint", path=absolute, model=model_name or None,
                         overwrite=overwrite)
    so = run_step_action(session, body, at_step=at_step, wait_s=wait_s)
    out = step_outcome(session, so, lambda ok: render_checkpoint(ok, session.colour)
                       + _framework(ok))
    out.stderr.insert(0, said)
    return out


def _framework(results: Sequence[RankResult]) -> list[str]:
    found = sorted({str(d["framework"]) for d in
                    (FinishedAction.from_wire(r.data).data for r in results)
                    if d.get("framework")})
    return [f"framework: {', '.join(found)}"] if found else []
