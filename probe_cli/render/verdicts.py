"""The hang and straggler verdicts as text and JSON (pure; stdlib only). The verdicts themselves
are diagnose/'s objects; the same objects reach the dashboard."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any

from probe_protocol.query import QueryBody

from ..diagnose.hang import HangVerdict
from ..diagnose.straggler import StragglerVerdict
from ..diagnose.verdict import Verdict
from ..result import RankResult


def render_verdict(v: Verdict) -> list[str]:
    """The headline, then each detail indented under it."""
    return [v.headline, *(f"  {d}" for d in v.details)]


def rank_answers(results: Sequence[RankResult]) -> list[dict[str, Any]]:
    """Which ranks answered, for a verdict's ``--json``: ``{rank, url, ok, error}`` each."""
    return [
        {"rank": r.rank, "url": r.url, "ok": r.ok,
         "error": None if r.ok else getattr(r.error, "reason", str(r.error))}
        for r in results
    ]


def hang_json(verdict: HangVerdict, results: Sequence[RankResult]) -> str:
    body: dict[str, Any] = verdict.to_json()
    body["ranks"] = rank_answers(results)
    return json.dumps(body, indent=2)


def straggler_json(verdict: StragglerVerdict, steps: dict[int, dict[str, Any]]) -> str:
    """The verdict plus every rank's ``straggler_steps`` wire body, keyed by rank."""
    body = verdict.to_json()
    body["steps"] = {str(k): v for k, v in steps.items()}
    return json.dumps(body, indent=2)


def render_straggler(verdict: StragglerVerdict, steps: dict[int, QueryBody]) -> list[str]:
    """The verdict, then each rank's step split (or why there is none)."""
    lines = render_verdict(verdict)
    if steps:
        columns = list(next(iter(steps.values())).columns)
        lines += ["", *render_step_table({k: list(v.rows) for k, v in steps.items()}, columns)]
    else:
        lines.append("step split: no rank records python.steps (module tracing off?)")
    return lines


def render_step_table(rows_by_rank: dict[int, list[list[Any]]], columns: list[str]) -> list[str]:
    """Per-rank step time and forward/backward/optimizer split (the straggler_steps query), with
    each rank's step time against the median rank's."""
    if not rows_by_rank:
        return []
    idx = {c: i for i, c in enumerate(columns)}
    data = {r: rows[0] for r, rows in rows_by_rank.items() if rows and rows[0][idx["steps"]]}
    if not data:
        return ["step times: none recorded yet (python.steps is empty)"]
    med = statistics.median(float(row[idx["step_ms"]]) for row in data.values())
    header = f"{'rank':>5} {'steps':>6} {'step ms':>9} {'vs median':>10} {'forward':>9} " \
             f"{'backward':>9} {'optimizer':>9} {'other':>9}"
    lines = [header]
    for r, row in sorted(data.items()):
        def ms(name: str) -> str:
            value = row[idx[name]]
            return f"{float(value):9.1f}" if value is not None else f"{'-':>9}"

        delta = float(row[idx["step_ms"]]) - med
        lines.append(f"{r:>5} {row[idx['steps']]:>6} {ms('step_ms')} {delta:>+10.1f} "
                     f"{ms('forward_ms')} {ms('backward_ms')} {ms('optimizer_ms')} "
                     f"{ms('other_ms')}")
    return lines
