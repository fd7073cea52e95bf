"""`probe health`: healthy / starting / hung / dead / straggling, per rank and for the job, in a
form a scheduler reads: one JSON object (``--json``), an exit code, and a host-exclude file.

Data: every rank's ``GET /v1/health?status`` (answered by its watchdog within milliseconds,
also while the rank's GIL is held and after it died; probe_agent/watchdog/health.py), then,
when every rank is up, the straggler verdict (`probe straggler`'s, from the collectives): a
rank the others keep waiting for is ``straggling``. When a rank is hung or dead, every rank that
answers is asked to write its post-mortem copy now (``POST /v1/postmortem``), so the copies
describe one moment.

The job's state is the worst rank's (dead > hung > straggling > starting > healthy). The
exclude list names the hosts of dead and straggling ranks (one per line: ``sbatch
--exclude=$(paste -sd, FILE)``); a hung rank's host is not blamed (a hang is the code's).
Exit code: 0 healthy or starting, 4 hung, dead or straggling, 3 some ranks did not answer.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

from ..errors import EXIT_FINDING, EXIT_PARTIAL
from ..gather.evidence import straggler_evidence, straggler_verdict
from ..outcome import Outcome
from ..render.text import format_table
from ..transport.client import ProbeClient
from ..transport.fanout import calling_live, fan_out, resolve_ranks
from ..transport.session import Session
from . import pass_session

ORDER = ("healthy", "starting", "straggling", "hung", "dead")
UNHEALTHY = ("straggling", "hung", "dead")


def job_state(states: list[str]) -> str:
    return max(states, key=ORDER.index) if states else "dead"


@click.command("health")
@click.option("--stall", type=click.FloatRange(min=1), default=None,
              help="Seconds without an optimizer step that count as hung (default 300, and "
                   "never under 20 of the rank's own steps).")
@click.option("--exclude-file", type=click.Path(dir_okay=False), default=None,
              help="Write the hosts of dead and straggling ranks here, one per line.")
@click.option("--no-straggler", is_flag=True, help="Skip the straggler check (no collectives "
              "round): only the watchdogs are asked.")
@pass_session
def command(session: Session, stall: float | None, exclude_file: str | None,
            no_straggler: bool) -> Outcome:
    """Each rank's health (healthy, starting, hung, dead, straggling) and the job's, for a
    scheduler or a liveness check. Exit code 0: healthy; 4: hung, dead or straggling; 3: some
    ranks did not answer."""
    targets = resolve_ranks(session)
    results = fan_out(session, targets, calling_live(ProbeClient.health_status, stall))
    ranks: list[dict[str, Any]] = []
    silent = []
    for r in sorted(results, key=lambda r: (r.rank is None, r.rank or 0)):
        if r.ok and isinstance(r.data, dict) and r.data.get("state"):
            ranks.append({k: r.data.get(k) for k in (
                "rank", "state", "reason", "step", "step_age_s", "heartbeat_age_s",
                "typical_step_s", "host", "pid")})
        else:
            silent.append(r)
            ranks.append({"rank": r.rank, "state": "dead" if _refused(r) else "unknown",
                          "reason": getattr(r.error, "reason", None) or str(r.error),
                          "host": None})
    states = [x["state"] for x in ranks if x["state"] in ORDER]
    if not no_straggler and states and all(s in ("healthy", "starting") for s in states):
        verdict, _ = straggler_verdict(fan_out(session, targets, straggler_evidence(20)),
                                       80, 0.1)
        if verdict.problem:
            for x in ranks:
                if x["rank"] in verdict.culprits:
                    x["state"], x["reason"] = "straggling", verdict.headline
    job = job_state([x["state"] for x in ranks if x["state"] in ORDER])
    copies = _copies_now(session, targets, ranks) if job in ("hung", "dead") else []
    exclude = sorted({str(x["host"]) for x in ranks if x["state"] in ("dead", "straggling")
                      and x.get("host")})
    if exclude_file:
        _write_exclude(exclude_file, exclude)
    out = Outcome()
    if session.output == "json":
        out.stdout.append(json.dumps({"job": job, "ranks": ranks, "exclude_hosts": exclude,
                                      "copies_written": copies}))
    else:
        out.stdout.append(f"job: {job}" + (f" (exclude hosts: {', '.join(exclude)})"
                                          if exclude else ""))
        out.stdout += format_table(
            ("RANK", "STATE", "STEP", "STEP AGE", "HOST", "REASON"),
            [[x["rank"], x["state"], "-" if x.get("step") is None else x["step"],
              "-" if x.get("step_age_s") is None else f"{x['step_age_s']:.1f} s",
              x.get("host") or "-", str(x.get("reason") or "")[:90]] for x in ranks],
            colour=session.colour)
        if copies:
            out.stdout.append(f"post-mortem copies written now on ranks "
                              f"{','.join(map(str, copies))}")
    out.exit_code = EXIT_FINDING if job in UNHEALTHY else EXIT_PARTIAL if silent else 0
    return out


def _refused(r: Any) -> bool:
    return getattr(r.error, "reason", None) == "connection refused"


def _copies_now(session: Session, targets: list[Any], ranks: list[dict[str, Any]]) -> list[int]:
    """Every live rank writes its post-mortem copy now; the ranks that did."""
    alive = {x["rank"] for x in ranks if x["state"] not in ("dead", "unknown")}
    asked = [t for t in targets if t.rank in alive]
    done = fan_out(session, asked, calling_live(ProbeClient.postmortem_now))
    return sorted(r.rank for r in done if r.ok and r.rank is not None)


def _write_exclude(path: str, hosts: list[str]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644),
              "w") as f:
        f.write("".join(f"{h}\n" for h in hosts))
    os.replace(tmp, path)
