"""`probe backtrace`: Python stacks of every rank, identical main-thread stacks grouped."""

from __future__ import annotations

from typing import Any

import click

from probe_protocol.bodies import BacktraceBody

from ..diagnose.ends import ends_lines
from ..gather.postmortem import session_job
from ..group import rank_label
from ..outcome import Outcome, finish
from ..render.children import render_children
from ..render.stacks import render_backtrace
from ..render.text import format_csv
from ..result import RankResult
from ..transport.fanout import fan_out_target_first
from ..transport.nodetree import NodeCall, fan_out_nodes
from ..transport.session import Session
from . import pass_session

CSV_COLUMNS = ("rank", "thread_id", "thread_name", "is_main", "depth", "func", "file", "lineno",
               "frame_type")


@click.command("backtrace")
@click.option("--locals", "show_locals", is_flag=True,
              help="Also show each frame's local variables (safe, truncated reprs).")
@click.option("--show-secrets", is_flag=True,
              help="With --locals: also show the values of locals whose names look like "
                   "secrets (key, token, secret, password, credential, auth). Default: redacted.")
@click.option("--native", is_flag=True,
              help="Ask for native (C/C++) frames too, where the agent's route can read them.")
@click.option("--all", "show_all", is_flag=True,
              help="Every rank in full with every thread, the agent's own included. Default: "
                   "main-thread stacks grouped across ranks, outliers first.")
@click.option("--children", "children", is_flag=True,
              help="Also each rank's child processes (DataLoader workers and others): pid, "
                   "worker id and Python stack, read from outside by the rank's watchdog (so "
                   "they come while a worker or the rank holds its GIL).")
@pass_session
def command(session: Session, show_locals: bool, show_secrets: bool, native: bool,
            show_all: bool, children: bool) -> Outcome:
    """Show where every rank is right now.

    Across ranks, main-thread stacks that are identical are printed once with their ranks
    (smallest groups first: the rank that is elsewhere is usually the one to look at).
    """
    # The target's own stack is asked for beside discovery, not after it: a rank whose event
    # loop is wedged answers /v1/ranks late, but its backtrace at once.
    flags = {"locals": show_locals, "native": native, "all": show_all}
    if show_secrets:
        flags["secrets"] = True
    if children:
        flags["children"] = True
    # The other ranks: one request per node where a host runs several (nodetree.py).
    node = NodeCall("backtrace", {k: int(v) for k, v in flags.items()})
    results = fan_out_target_first(
        session,
        lambda client, _: client.backtrace(locals=show_locals, native=native, all=show_all,
                                            secrets=show_secrets, children=children),
        spread=lambda s, targets, call: fan_out_nodes(s, targets, call, node),
    )

    def render(ok: list[RankResult]) -> list[str]:
        if session.output == "csv":
            return format_csv(CSV_COLUMNS, list(_frame_rows(ok)))
        lines = render_backtrace(
            ok, show_all=show_all, show_locals=show_locals, colour=session.colour
        )
        if children:
            lines += ["", *render_children(ok, show_locals=show_locals, show_all=show_all,
                                           colour=session.colour)]
        return lines

    out = finish(session, results, render)
    ok = [r for r in results if r.ok]
    out.stderr[:0] = _stopped_notes(ok) + (_native_notes(ok) if native else [])
    job = session_job(session)
    if job is not None and session.output == "text":  # the last stacks, with the deaths
        out.stdout += ends_lines(job)
    return out


def _stopped_notes(ok: list[RankResult]) -> list[str]:
    """A stopped rank (SIGSTOP, a debugger) looks hung; say so, and how to resume it."""
    bodies = [(r, BacktraceBody.from_wire(r.data)) for r in ok]
    return [f"note: rank {r.rank} (pid {b.pid or r.pid}): {b.stopped}" for r, b in bodies
            if b.stopped]


def _native_notes(ok: list[RankResult]) -> list[str]:
    """Say so when --native was asked for but a rank's route reads Python frames only."""
    without = [r.rank for r in ok if BacktraceBody.from_wire(r.data).native is False]
    if not without:
        return []
    return [
        f"note: {rank_label(without)}: no native frames from the in-process route; on the "
        "rank's node `py-spy dump --native --pid PID` shows them"
    ]


def _frame_rows(results: list[RankResult]) -> Any:
    for r in results:
        for t in BacktraceBody.from_wire(r.data).threads:
            for f in t.get("frames") or []:
                yield [r.rank, t.get("thread_id"), t.get("thread_name"), t.get("is_main"),
                       f.get("depth"), f.get("func"), f.get("file"), f.get("lineno"),
                       f.get("frame_type")]
