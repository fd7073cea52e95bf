"""`probe postmortem`: the post-mortem copies on this machine (or under DIR): job, ranks, when,
and how each rank ended. `probe -t DIR COMMAND` then reads one (transport/postmortem.py)."""

from __future__ import annotations

import os
import time

import click

from probe_protocol import postmortem as layout

from ..diagnose.ends import ends_lines
from ..errors import ProbeCLIError
from ..outcome import Outcome
from ..transport.postmortem import find_job, jobs_in
from ..transport.session import Session
from ..transport.untrusted_text import escape_controls
from . import pass_session


def job_lines(path: str) -> list[str]:
    job = find_job(path)
    when = max((c.copied_at or 0 for c in job.ranks.values()), default=0)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if when else "never"
    lines = [f"{job.label}  ranks {','.join(map(str, sorted(job.ranks)))} of {job.world_size}"
             f"  last copy {stamp}"]
    return lines + ends_lines(job)[1:]


@click.command("postmortem")
@click.argument("root", required=False)
@pass_session
def command(session: Session, root: str | None) -> Outcome:
    """List the post-mortem copies of dead jobs: in ROOT, else in $PROBE_POSTMORTEM_DIR and
    the run dir's postmortem/. Read one with `probe -t DIR hang|doctor|steps|query ...`."""
    env = dict(os.environ)
    if session.run_dir:
        env["PROBE_RUN_DIR"] = session.run_dir  # --run-dir, not only the variable
    roots = [root] if root else layout.roots(env)
    out = Outcome()
    for r in roots:
        for path in jobs_in(r):
            try:
                out.stdout += job_lines(path)
            except ProbeCLIError as e:  # one unreadable job must not hide the rest
                out.stderr.append(f"{escape_controls(path)}: {e.message}")
    if not out.stdout:
        out.stderr.append(f"no post-mortem copies in {', '.join(roots)}")
    return out
