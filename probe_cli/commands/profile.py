"""`probe profile`: torch.profiler over the same N optimizer steps on every rank, merged.

1. Queue the ``profile`` step-boundary action (transport/step_actions.py): every rank starts
   its profiler right after step S and stops it right after step S+N, on its own (a CLI that
   dies leaves no profiler running; the agent also stops it after --max-seconds).
2. Wait until every rank has written its trace (``GET /v1/profile/ID?wait=``).
3. Estimate each rank's clock offset from a request's round trip (export/trace_merge.py).
4. Stream each rank's trace to a file next to ``-o`` (memory stays flat), merge them into one
   Perfetto/Chrome trace, one process per rank, and remove the per-rank files.
5. Print the top operators per rank and the step spans side by side; the measured cost per
   profiled step goes to stderr (and to every rank's audit table, python.audit kind 'profile').
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import click

from probe_protocol.actions import ActionRequest

from ..errors import EXIT_USAGE, ProbeCLIError
from ..export.trace_merge import RankTrace, merge_traces
from ..outcome import Outcome
from ..output_files import private_dir, refuse_existing
from ..render.profile import (
    cost_lines,
    render_step_spans,
    render_top_ops,
    stopped_notes,
    trace_line,
    window_of,
)
from ..result import RankResult
from ..transport.client import ProbeClient
from ..transport.fanout import RankTarget, calling_live, fan_out, parallel_map, resolve_ranks
from ..transport.rank_client import RankClient, live
from ..transport.session import Session
from ..transport.step_actions import (
    StepActionError,
    StepOutcome,
    answer_lost,
    run_step_action,
)
from . import pass_session
from ._step_options import at_step_option, check_exclusive, step_outcome, wait_option
from ._window import for_option

#: The agents' ceilings (probe_agent/actions/profile.py): above them needs --max-steps.
MAX_STEPS = 20
MAX_SECONDS = 120.0
#: Extra time, after the window's ceiling, for the ranks to write their traces.
EXPORT_GRACE_S = 120.0


@click.command("profile")
@for_option(5, 1, "Profile the next N optimizer steps on every rank (the same N steps "
            "everywhere).")
@click.option("--max-steps", type=click.IntRange(min=1), default=MAX_STEPS, show_default=True,
              metavar="N", help="Ceiling on --for; raise it to profile more steps (each "
              "profiled step costs extra time and tens of MB of trace).")
@click.option("--max-seconds", type=click.FloatRange(min=0, min_open=True),
              default=MAX_SECONDS, show_default=True, metavar="SECONDS",
              help="The agents stop their profiler after this long even if the steps do not "
                   "come (a hung rank), so nothing is left running.")
@click.option("--next-step", is_flag=True,
              help="Start right after the next step (the default without --at-step).")
@click.option("-o", "--output", "out_path", type=click.Path(dir_okay=False), default=None,
              metavar="FILE", help="Merged trace file. Default: ./probe-profile-<id>.json.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing output file (never written through a symlink).")
@click.option("--record-shapes", is_flag=True, help="Record input shapes of each operator.")
@click.option("--with-stack", is_flag=True,
              help="Record the Python stack of each operator (larger traces).")
@at_step_option
@wait_option
@pass_session
def command(session: Session, ahead: int, max_steps: int, max_seconds: float, next_step: bool,
            out_path: str | None, overwrite: bool, record_shapes: bool, with_stack: bool,
            at_step: int | None, wait_s: float) -> Outcome:
    """Profile the same optimizer steps on every rank with torch.profiler (CPU, plus CUDA where
    the job uses it), starting and stopping at the same step boundary, then write one merged
    Perfetto trace (one process per rank, on a common clock) and print each rank's top
    operators and step spans side by side. Refused while another profiler runs in a rank
    (the program's own torch.profiler or another `probe profile`); training goes on either way.
    """
    check_exclusive(at_step, next_step)
    if out_path:
        refuse_existing(out_path, overwrite)  # before the window, not after it
    if ahead > max_steps:
        raise ProbeCLIError(
            f"profile --for {ahead} refused: above the ceiling of {max_steps} steps (each "
            f"profiled step costs extra time and trace size); pass --max-steps {ahead} to raise "
            "it", exit_code=EXIT_USAGE)
    body = ActionRequest(kind="profile", profile={
        "ahead": ahead, "max_steps": max_steps, "max_seconds": max_seconds,
        "record_shapes": record_shapes, "with_stack": with_stack})
    so = run_step_action(session, body, at_step=at_step, wait_s=wait_s)
    started = [r for r in so.results if r.ok]
    if len(started) < len(so.results) or not started:
        out = step_outcome(session, so, lambda ok: [])
        if started:
            out.stderr.append("probe: the ranks where it started stop on their own after "
                              f"{ahead} steps; nothing is merged")
        return out
    targets = {t.endpoint.label: t for t in resolve_ranks(session)}
    mine = [targets[r.url] for r in started]
    windows = [_unfinished_fails(r) for r in
               _wait_windows(session, mine, so.action_id, max_seconds + EXPORT_GRACE_S)]
    done = [r for r in windows if r.ok and window_of(r).get("state") == "done"]
    out = step_outcome(session, StepOutcome(so.action_id, so.target, windows, so.notes),
                       lambda ok: [])
    if not done:
        out.stderr.append("probe: no rank produced a trace")
        return out
    offsets = _clock_offsets(session, [targets[r.url] for r in done])
    path = out_path or f"probe-profile-{so.action_id}.json"
    report, fetch_failed = _gather_and_merge(session, done, targets, so.action_id, path, offsets,
                                             overwrite)
    ops = report.ops if report else {}
    for r in done:  # --json carries them too, next to each rank's window
        window_of(r)["top_ops"] = ops.get(r.rank, [])
    if session.output == "json":
        from ..render.text import render_json

        out.stdout[:] = [render_json(windows)]  # the windows, now with their operators
    else:
        origin = report.origin_epoch_s if report else 0.0
        out.stdout += render_top_ops(ops, colour=session.colour) + [""]
        out.stdout += render_step_spans(done, origin, offsets, colour=session.colour)
    out.stderr += stopped_notes(done) + cost_lines(done)
    out.stderr += [f"probe: rank {r.rank}: trace not fetched: {r.error.message if r.error else '?'}"
                   for r in fetch_failed]
    if report is not None:
        out.stderr += report.notes
        out.stderr.append(trace_line(report.path, report.bytes, len(report.events),
                                     report.steps))
    if fetch_failed and out.exit_code == 0:
        out.exit_code = 3
    return out


def _unfinished_fails(r: RankResult) -> RankResult:
    """A rank whose window did not end with a trace is a failed rank (exit 3, listed)."""
    w = window_of(r)
    if not r.ok or w.get("state") == "done":
        return r
    if w.get("state") == "error":
        why = f"its profile failed: {w.get('error')}"
    else:
        why = (f"its profile is still {w.get('state')} (a rank that stopped stepping ends "
               "its window at its next module call or step); `probe actions` shows it")
    err = StepActionError(f"rank {r.rank}: {why}", url=r.url, reason=why)
    return RankResult(r.rank, r.url, False, r.data, err, r.host, r.pid)


def _wait_windows(session: Session, targets: list[RankTarget], profile_id: str,
                  limit_s: float) -> list[RankResult]:
    """Long-poll every rank until its window is done (or failed), at most ``limit_s``."""
    deadline = time.monotonic() + limit_s
    final: dict[str, RankResult] = {}
    pending = list(targets)
    while pending and time.monotonic() < deadline:
        hold = round(max(0.0, min(deadline - time.monotonic(), session.timeout * 0.5, 2.0)), 2)
        answers = fan_out(session, pending,
                          calling_live(ProbeClient.profile, profile_id, wait=hold))
        by_url = {r.url: r for r in answers}
        still, lost = [], 0
        for t in pending:
            r = by_url[t.endpoint.label]
            if not r.ok and answer_lost(r):
                lost += 1
                # A 504 or a timeout while the rank stops its profiler and writes the trace
                # (the export holds its GIL for seconds): the window is still there; ask again.
                final.setdefault(t.endpoint.label, r)
                still.append(t)
                continue
            if not r.ok or window_of(r).get("state") in ("done", "error"):
                final[t.endpoint.label] = r
            else:
                still.append(t)
                final[t.endpoint.label] = r
        pending = still
        if pending and lost == len(pending):
            time.sleep(0.5)  # a 504 comes back at once while the GIL is held: do not spin
    return sorted(final.values(), key=lambda r: (r.rank is None, r.rank or 0))


def _clock_offsets(session: Session, targets: list[RankTarget]) -> dict[Any, float]:
    """Each rank's ``time.time()`` minus ours, from the best of 3 round trips (error <= RTT/2)."""
    def offset(t: RankTarget) -> tuple[Any, float]:
        best: tuple[float, float] | None = None
        client = session.live_client(t.endpoint, "step")
        for _ in range(3):
            t0 = time.time()
            try:
                now = client.step().get("now")
            except ProbeCLIError:
                continue
            t1 = time.time()
            if isinstance(now, (int, float)) and (best is None or t1 - t0 < best[0]):
                best = (t1 - t0, now - (t0 + t1) / 2)
        return t.rank, best[1] if best else 0.0

    return dict(parallel_map(session, targets, offset))


def _gather_and_merge(session: Session, done: list[RankResult],
                      targets: dict[str, RankTarget], profile_id: str, path: str,
                      offsets: dict[Any, float], overwrite: bool
                      ) -> tuple[Any, list[RankResult]]:
    """Stream every rank's trace into a private directory beside ``path`` (mkdtemp: nothing in
    it can have been planted), merge into ``path``, remove them."""
    parts = private_dir(path)
    by_rank = {r.rank: r for r in done}

    def fetch(client: RankClient, t: RankTarget) -> dict[str, Any]:
        return live(client, "profile_trace").profile_trace(
            profile_id, os.path.join(parts, f"rank{t.rank}.json"),
            read_timeout=max(session.timeout, 120.0))

    fetched = fan_out(session, [targets[r.url] for r in done], fetch)
    ok = [f for f in fetched if f.ok]
    traces = []
    for f in ok:
        w = window_of(by_rank[f.rank])
        spans = w.get("step_spans") or []
        traces.append(RankTrace(rank=int(f.rank or 0), path=(f.data or {})["path"],
                                pid=f.pid or w.get("pid"), host=f.host,
                                clock_offset_s=offsets.get(f.rank, 0.0),
                                window_start=spans[0]["start"] if spans else None))
    try:
        report = merge_traces(traces, path, workers=os.cpu_count() or 1,
                              overwrite=overwrite) if traces else None
    finally:
        shutil.rmtree(parts, ignore_errors=True)
    return report, [f for f in fetched if not f.ok]

