"""`probe hang`: one verdict for a stuck job, from every rank's collectives and main stack.

Data (fan-out: ``/v1/backtrace`` + ``/v1/collectives`` per rank) -> ``hang.diagnose`` (pure) ->
``hang.render_verdict`` lines -> printed here.
"""

from __future__ import annotations

import json
from typing import Any

import click

from ..client import ProbeClient
from ..errors import EXIT_FINDING, AgentUnreachableError
from ..fanout import RankTarget, fan_out, resolve_ranks
from ..hang import RankState, Verdict, diagnose, render_verdict
from ..outcome import Outcome
from ..result import RankResult
from ..session import Session
from . import pass_session

#: Exit code when the diagnosis found a problem: a hang, a failed collective, a silent rank.
EXIT_PROBLEM = EXIT_FINDING

#: Recent collectives asked of each rank: enough to see the last done and every pending one.
RECENT = 64


def _both(client: ProbeClient, _: RankTarget) -> dict[str, Any]:
    bt = client.backtrace()
    coll = client.request("GET", "/v1/collectives", params={"limit": RECENT})
    return {"ok": True, "rank": bt.get("rank"), "pid": bt.get("pid"), "host": bt.get("host"),
            "backtrace": bt, "collectives": coll}


def rank_state(r: RankResult) -> RankState:
    rank = r.rank if r.rank is not None else -1
    if not r.ok or r.data is None:
        err = r.error
        reason = getattr(err, "reason", None) or str(err)
        dead = isinstance(err, AgentUnreachableError) and reason == "connection refused"
        body = getattr(err, "body", None) or {}
        if body.get("state") == "dead":  # its watchdog reports the death (issue 5)
            cause = (body.get("exit") or {}).get("description") or "exited"
            step = body.get("last_step")
            at = f" at step {step}" if step is not None else ""
            return RankState(rank, error=f"is dead: {cause}{at} (its watchdog reports it)",
                             dead=True)
        return RankState(rank, error=reason, dead=dead)
    threads = r.data["backtrace"].get("threads", ())
    main = next((t for t in threads if t.get("is_main")), None)
    coll = r.data["collectives"]
    return RankState(
        rank,
        frames=tuple(main.get("frames", ())) if main else (),
        collectives=tuple(coll.get("collectives", ())),
        now=float(coll.get("now") or 0.0),
    )


def gather_hang(session: Session, min_wait: float) -> tuple[Verdict, list[RankResult]]:
    results = fan_out(session, resolve_ranks(session), _both)
    return diagnose([rank_state(r) for r in results], min_wait_s=min_wait), results


def verdict_json(verdict: Verdict, results: list[RankResult]) -> str:
    body: dict[str, Any] = verdict.to_json()
    body["ranks"] = [
        {"rank": r.rank, "url": r.url, "ok": r.ok,
         "error": None if r.ok else getattr(r.error, "reason", str(r.error))}
        for r in results
    ]
    return json.dumps(body, indent=2)


@click.command("hang")
@click.option("--min-wait", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Only collectives entered at least this many seconds ago count as waits; a "
                   "healthy job is always a few ms into some all_reduce.")
@pass_session
def command(session: Session, min_wait: float) -> Outcome:
    """Name the rank(s) the others wait for, the collective and seq they wait in, and where
    the odd ranks are instead.

    Exit code 0: nothing stuck; 4: a problem was found (a hang, a failed collective, a rank
    that did not answer: the verdict names it).
    """
    verdict, results = gather_hang(session, min_wait)
    if session.output == "json":
        lines = [verdict_json(verdict, results)]
    else:
        lines = render_verdict(verdict)
    return Outcome(stdout=lines, exit_code=EXIT_PROBLEM if verdict.problem else 0)
