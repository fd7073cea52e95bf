"""`probe info`: who every rank is (host, pid, versions, uptime)."""

from __future__ import annotations

import click

from probe_protocol.bodies import InfoBody
from probe_protocol.version import disagreement

from ..outcome import Outcome, finish
from ..render.patches import patch_lines
from ..render.text import format_csv, format_duration, info_rows, render_info
from ..result import RankResult
from ..transport.fanout import run_on_ranks
from ..transport.rank_client import RankClient
from ..transport.session import Session
from . import pass_session


@click.command("info")
@pass_session
def command(session: Session) -> Outcome:
    """Every rank's host, pid, Python, torch and probe versions, and agent uptime; then what
    the agent changed in each process: the torch and stdlib attributes it replaced (and which
    stay for the life of the process, and why) and the process-wide settings it set."""
    results = run_on_ranks(session, RankClient.info)

    def render(ok: list[RankResult]) -> list[str]:
        if session.output == "csv":
            return format_csv(*info_rows(ok, raw=True))
        return render_info(ok, session.colour) + patch_lines(ok, session.colour)

    out = finish(session, results, render)
    out.stderr[:0] = [n for r in results if r.ok and (n := watchdog_note(r))]
    out.stderr[:0] = [f"note: {n}" for r in results if r.ok and (n := disagreement(
        InfoBody.from_wire(r.data).format, f"rank {r.rank}'s agent"))]
    return out


def watchdog_note(r: RankResult) -> str | None:
    """``note: rank 0: its watchdog was restarted 2 times (last: killed by SIGKILL, 5s ago)``:
    a restarted watchdog means something kills processes on that node."""
    info = InfoBody.from_wire(r.data)
    wd = info.watchdog or {}
    restarts = wd.get("restarts") or 0
    if not restarts and not wd.get("gave_up"):
        return None
    last = str(wd.get("last_death") or "cause unknown")
    at, now = wd.get("last_death_at"), info.now
    if isinstance(at, (int, float)) and now is not None:
        last += f", {format_duration(max(0.0, now - at))} ago"
    times = "time" if restarts == 1 else "times"
    text = f"note: rank {r.rank}: its watchdog was restarted {restarts} {times} (last: {last})"
    if wd.get("gave_up"):
        text += ("; it kept dying, so the agent serves in-process now, without the "
                 "out-of-process backtrace (see the rank's <pid>.watchdog.log)")
    return text

