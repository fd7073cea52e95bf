"""`probe compare A B`: two runs side by side, module by module, with a CI exit code.

A and B are any two targets probe understands (a live job's HOST:PORT or PID, a post-mortem
directory, a URL). Data (gather/runs.py: the same queries on both) -> ``diagnose.compare``
(pure) -> ``render.compare`` -> printed by main.py. Exit 4 when B's step time differs from A's
by more than the threshold at the stated confidence, 0 when not, 1 when a side has no answer.
"""

from __future__ import annotations

from dataclasses import replace

import click

from ..diagnose.compare import compare_runs
from ..errors import EXIT_FINDING, EXIT_OK, EXIT_PARTIAL, ProbeCLIError
from ..gather.runs import gather_run
from ..outcome import Outcome, failure_summary
from ..render.compare import compare_json, render_compare
from ..transport.session import Session
from ..transport.targets import default_run_dir, parse_endpoints
from . import pass_session


@click.command("compare")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("--last", type=click.IntRange(min=5), default=200, show_default=True,
              help="Compare the last N steps each run kept (traced ones for modules).")
@click.option("--threshold", type=click.FloatRange(0, 100, min_open=True), default=5.0,
              show_default=True, metavar="PCT",
              help="Find a change (exit 4) only when B's step time differs from A's by at "
                   "least PCT percent at the given confidence (the whole interval beyond it).")
@click.option("--confidence", type=click.FloatRange(0.5, 0.999), default=0.95,
              show_default=True, help="Confidence of the intervals.")
@click.option("--slower-only", is_flag=True,
              help="Exit 4 only when B is slower (a CI gate on regressions); a faster B is "
                   "still reported.")
@click.option("--limit", type=click.IntRange(min=1), default=10, show_default=True,
              help="Modules listed, largest change first.")
@pass_session
def command(session: Session, a: str, b: str, last: int, threshold: float, confidence: float,
            slower_only: bool, limit: int) -> Outcome:
    """Compare run B against run A: step time, tokens/s and MFU with intervals (Hodges-Lehmann
    shift over the steps each kept: a few disturbed steps do not decide), then each module's
    forward and backward self time per traced step, largest change first, with the share of the
    step-time change it explains, then memory by kind, where the step goes, the LR schedule,
    the batch and what each job runs, only where they changed. A and B: HOST:PORT, a local PID,
    a URL, or a post-mortem directory (`probe postmortem` lists them; PROBE_POSTMORTEM=always
    keeps a clean run's copy to compare later). Exit 4: a change beyond --threshold; 0: none;
    3: some ranks did not answer; 1: a side had nothing to compare."""
    runs = []
    stderr: list[str] = []
    for side, target in (("A", a), ("B", b)):
        sub = _session_for(session, target)
        try:
            run = gather_run(sub, last, f"{target}")
        finally:
            sub.close()
        if not run.ranks:
            why = run.failed[0].error.message if run.failed and run.failed[0].error else ""
            raise ProbeCLIError(
                f"{side} ({target}): no rank answered{': ' + why if why else ''}",
                help_text="`probe ps` lists the agents on this machine, `probe postmortem` "
                          "the post-mortem copies")
        stderr += [f"{side}: {line}" for line in
                   failure_summary(run.failed, session.timeout, None)]
        runs.append(run)
    verdict = compare_runs(runs[0], runs[1], threshold=threshold / 100, confidence=confidence,
                           slower_only=slower_only)
    lines = ([compare_json(verdict)] if session.output == "json"
             else render_compare(verdict, limit))
    code = EXIT_FINDING if verdict.problem else EXIT_OK
    if code == EXIT_OK and any(r.failed for r in runs):
        code = EXIT_PARTIAL
    return Outcome(stdout=lines, stderr=stderr, exit_code=code)


def _session_for(session: Session, target: str) -> Session:
    """The invocation's options (token, timeout, TLS, --rank) with ``target`` as its only
    target: each run is reached as `probe -t TARGET` would reach it."""
    scheme = "https" if session.cacert else "http"
    endpoints = parse_endpoints([target], default_run_dir(), scheme)
    return replace(session, endpoints=endpoints, rank_cache=None, notes=session.notes,
                   _clients={}, target_note=None)
