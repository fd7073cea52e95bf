"""`probe straggler`: which rank the others wait for, by how much, and each rank's step split.

Data (fan-out: ``/v1/collectives`` and the ``straggler_steps`` canned query per rank) ->
``straggler.diagnose_stragglers`` / ``straggler.step_table`` (pure) -> printed by main.py.
"""

from __future__ import annotations

import json
from typing import Any

import click

from ..client import ProbeClient
from ..errors import RankError
from ..fanout import RankTarget, fan_out, resolve_ranks
from ..outcome import Outcome, failure_summary
from ..session import Session
from ..straggler import diagnose_stragglers, step_table
from . import pass_session
from .hang import EXIT_PROBLEM


def _gather(last: int) -> Any:
    def call(client: ProbeClient, _: RankTarget) -> dict[str, Any]:
        coll = client.request("GET", "/v1/collectives", params={"limit": min(10_000, 4 * last)})
        try:
            steps: dict[str, Any] | None = client.request(
                "POST", "/v1/queries/straggler_steps", json={"params": {"last_steps": last}}
            )
        except RankError:  # python.steps not recorded by this agent (tracing not built/on)
            steps = None
        return {"ok": True, "rank": coll.get("rank"), "collectives": coll, "steps": steps}

    return call


@click.command("straggler")
@click.option("--last", type=click.IntRange(min=2), default=50, show_default=True,
              help="Look at the last N steps (and about 4N collectives).")
@click.option("--min-share", type=click.FloatRange(0, 1), default=0.05, show_default=True,
              help="Name a straggler only if the others spent at least this share of the "
                   "window waiting for it.")
@pass_session
def command(session: Session, last: int, min_share: float) -> Outcome:
    """Name the slow rank: the one the others wait for in collectives, how much slower it is
    than the median rank, and every rank's step time split into forward, backward, optimizer
    and other. Exit code 0: no straggler; 4: one was found; 3: some ranks did not answer."""
    results = fan_out(session, resolve_ranks(session), _gather(last))
    data: dict[int, dict[str, Any]] = {
        r.rank: r.data for r in results if r.ok and r.data and r.rank is not None
    }
    rows = {k: list(d["collectives"].get("collectives", ())) for k, d in data.items()}
    verdict = diagnose_stragglers(rows, last=4 * last, min_share=min_share)
    steps = {k: d["steps"] for k, d in data.items() if d.get("steps")}
    out = Outcome()
    if session.output == "json":
        body = verdict.to_json()
        body["steps"] = {str(k): v for k, v in steps.items()}
        out.stdout.append(json.dumps(body, indent=2))
    else:
        out.stdout += [verdict.headline, *(f"  {d}" for d in verdict.details)]
        if steps:
            columns = next(iter(steps.values()))["columns"]
            out.stdout += ["", *step_table({k: v["rows"] for k, v in steps.items()}, columns)]
        else:
            out.stdout.append("step split: no rank records python.steps (module tracing off?)")
    out.stderr = failure_summary(results, session.timeout, session.target_note)
    out.exit_code = EXIT_PROBLEM if verdict.problem else (3 if out.stderr else 0)
    return out
