"""`probe flame`: sample every rank's Python stacks for T seconds and merge them.

Every rank samples for ``--seconds`` with ``py-spy record --nonblocking`` where it may read the
rank, else in-process (``--sampler``; why: probe_agent/profiling/pyspy.py and
bench/bench_profile.py), and stops by itself then, whether or not this command is still waiting.
The CLI starts the same session id on every rank, waits, and writes:

- ``FILE.folded``: folded stacks of every rank, each under a ``rank N`` root frame;
- ``FILE.speedscope.json``: one profile per rank (https://www.speedscope.app);
- ``FILE.svg`` and ``FILE.html``: a self-contained flame graph of all ranks (the HTML adds the
  tables below; no script, nothing fetched, so a dashboard can link it).

It prints the widest frames with each rank's share, the hottest frames (self time), and the
frames where one rank spends far more time than the median of the ranks; the measured cost (the
step time during sampling over the steps before, per rank) goes to stderr and to each rank's
audit table (python.audit kind 'flame').
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import click

from probe_protocol.actions import FlameRequest

from ..errors import EXIT_USAGE, ProbeCLIError, RankError
from ..export.flame import flame_tables, folded_lines, merge_folded, to_speedscope
from ..export.flame_svg import to_html, to_svg
from ..outcome import Outcome, finish
from ..output_files import output_file, refuse_existing
from ..render.flame import render_flame
from ..result import RankResult
from ..transport.client import ProbeClient
from ..transport.fanout import RankTarget, calling_live, fan_out, resolve_ranks
from ..transport.session import Session
from ..transport.step_actions import requested_by
from . import pass_session

#: The agents' ceiling (probe_agent/actions/profile.py FLAME_MAX_SECONDS).
MAX_SECONDS = 60.0


@click.command("flame")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, metavar="T", help="How long every rank samples.")
@click.option("--rate", type=click.FloatRange(min=1, max=1000), default=100.0,
              show_default=True, metavar="HZ", help="Samples per second per rank.")
@click.option("--max-seconds", type=click.FloatRange(min=0, min_open=True),
              default=MAX_SECONDS, show_default=True, metavar="T",
              help="Ceiling on --seconds; raise it to sample longer.")
@click.option("--sampler", type=click.Choice(["auto", "py-spy", "in-process"]), default="auto",
              show_default=True,
              help="auto: py-spy record --nonblocking where it may read the rank (it costs the "
                   "training thread nothing measurable), else the in-process sampler (1-5% at "
                   "100 Hz; no ptrace needed).")
@click.option("-o", "--output", "out_base", type=click.Path(dir_okay=False), default=None,
              metavar="FILE", help="Base name of the files written (FILE.folded, "
              "FILE.speedscope.json, FILE.svg, FILE.html). Default: ./probe-flame-<id>.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing output file (never written through a symlink).")
@pass_session
def command(session: Session, seconds: float, rate: float, max_seconds: float, sampler: str,
            out_base: str | None, overwrite: bool) -> Outcome:
    """Sample the Python stacks of every rank for T seconds and merge them into one flame graph
    (folded stacks, speedscope JSON, SVG and HTML). Prints the widest frames per rank and the
    frames where one rank spends far more time than the others. The agent's own frames are
    hidden.
    """
    if seconds > max_seconds:
        raise ProbeCLIError(f"flame --seconds {seconds:g} refused: above the ceiling of "
                            f"{max_seconds:g} s; pass --max-seconds {seconds:g} to raise it",
                            exit_code=EXIT_USAGE)
    flame_id = uuid.uuid4().hex[:12]
    if out_base:  # before sampling, not after it
        for suffix in SUFFIXES:
            refuse_existing(out_base + suffix, overwrite)
    body = FlameRequest(seconds=seconds, rate=rate, max_seconds=max_seconds, sampler=sampler,
                        id=flame_id, requested_by=requested_by())
    targets = resolve_ranks(session)
    started = fan_out(session, targets, calling_live(ProbeClient.start_flame, body))
    ok_urls = {r.url for r in started if r.ok}
    running = [t for t in targets if t.endpoint.label in ok_urls]
    results = [_unfinished_fails(r) for r in _wait(session, running, flame_id, seconds)]
    results += [r for r in started if not r.ok]
    done = {r.rank: _flame(r)["folded"] for r in results
            if r.ok and _flame(r).get("state") == "done" and r.rank is not None}
    out = finish(session, sorted(results, key=lambda r: (r.rank is None, r.rank or 0)),
                 lambda ok: render_flame(flame_tables(done), session.colour) if done else [])
    if done:
        base = out_base or f"probe-flame-{flame_id}"
        out.stderr += _write(base, done, seconds, rate, overwrite)
    out.stderr += _cost_lines(results)
    return out


def _flame(r: RankResult) -> dict[str, Any]:
    return (r.data or {}).get("flame") or {}


def _unfinished_fails(r: RankResult) -> RankResult:
    """A rank whose sampling did not finish with stacks is a failed rank (exit 3, listed)."""
    f = _flame(r)
    if not r.ok or f.get("state") == "done":
        return r
    why = (f"its sampler failed: {f.get('error')}" if f.get("state") == "error"
           else f"its sampler is still {f.get('state')}")
    err = RankError(f"rank {r.rank}: {why}", url=r.url, reason=why)
    return RankResult(r.rank, r.url, False, r.data, err, r.host, r.pid)


#: How long after the sampling ends the ranks get to answer (they compute the cost, then reply).
GRACE_S = 30.0


def _wait(session: Session, targets: list[RankTarget], flame_id: str,
          seconds: float) -> list[RankResult]:
    """Sleep through the sampling, then long-poll until every rank has finished."""
    deadline = time.monotonic() + seconds + GRACE_S
    if targets:
        time.sleep(max(0.0, seconds - 1.0))
    final: dict[str, RankResult] = {}
    pending = list(targets)
    while pending and time.monotonic() < deadline:
        hold = round(max(0.0, min(deadline - time.monotonic(), session.timeout * 0.5, 2.0)), 2)
        answers = {r.url: r for r in fan_out(
            session, pending, calling_live(ProbeClient.flame, flame_id, wait=hold))}
        still = []
        for t in pending:
            r = final[t.endpoint.label] = answers[t.endpoint.label]
            if r.ok and _flame(r).get("state") == "sampling":
                still.append(t)
        pending = still
    return list(final.values())


#: The files ``-o BASE`` names.
SUFFIXES = (".folded", ".speedscope.json", ".svg", ".html")


def _write(base: str, per_rank: dict[int, Any], seconds: float, rate: float,
           overwrite: bool) -> list[str]:
    merged = merge_folded(per_rank)
    title = (f"probe flame: {len(per_rank)} rank(s), {seconds:g} s at {rate:g} Hz "
             f"({sum(merged.values())} samples)")
    with output_file(base + ".folded", overwrite=overwrite) as f:
        f.write("\n".join(folded_lines(merged)) + "\n")
    with output_file(base + ".speedscope.json", overwrite=overwrite) as f:
        json.dump(to_speedscope(per_rank, title), f)
    svg = to_svg(merged, title)
    with output_file(base + ".svg", overwrite=overwrite) as f:
        f.write(svg)
    with output_file(base + ".html", overwrite=overwrite) as f:
        f.write(to_html(svg, title, render_flame(flame_tables(per_rank))))
    return [f"probe: flame graph written to {base}.html and {base}.svg; stacks in "
            f"{base}.folded and {base}.speedscope.json (open in https://www.speedscope.app)"]


def _cost_lines(results: list[RankResult]) -> list[str]:
    parts = []
    for r in sorted(results, key=lambda r: r.rank or 0):
        f = _flame(r)
        c = f.get("cost") or {}
        used = f"{c.get('sampler')}" + (f", because {f['sampler_note']}"
                                        if f.get("sampler_note") and c.get("sampler") else "")
        if "ratio" in c:
            parts.append(f"rank {r.rank} x{c['ratio']:.3f} ({c['window_ms']:.1f} ms vs "
                         f"{c['before_ms']:.1f} ms; {used}, its CPU {c['sampler_cpu_ms']:.0f} ms)")
        elif c:
            parts.append(f"rank {r.rank}: {c.get('samples', 0)} samples ({used}, its CPU "
                         f"{c.get('sampler_cpu_ms', 0):.0f} ms; no whole step to compare)")
    if not parts:
        return []
    return ["probe: sampling cost, median step time while sampling vs the 20 steps before: "
            + ", ".join(parts)]
