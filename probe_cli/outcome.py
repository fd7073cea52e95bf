"""The shared second half of every command: results -> what to print -> exit code.

A command returns an ``Outcome``; main.py prints ``stdout`` and ``stderr`` and returns
``exit_code``. Commands never print themselves, so they stay testable as plain functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from .errors import (
    EXIT_FAILURE,
    EXIT_FINDING,
    EXIT_OK,
    EXIT_PARTIAL,
    AgentHTTPError,
    ProbeCLIError,
    RankError,
)
from .group import compact_ranges, group_by
from .render.text import render_json
from .result import RankResult
from .transport.session import Session


@dataclass(slots=True)
class Outcome:
    """What a command produced. ``stdout`` holds results only; ``stderr`` progress-free notes,
    warnings and the failure summary (lines without newlines). ``stream``, when set, is results
    still being fetched (``probe query --json``): main.py prints it as it comes, before
    ``stdout``, while the session is open; consuming it sets ``stderr`` and ``exit_code``."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    exit_code: int = EXIT_OK
    stream: Iterator[str] | None = None


def exit_code(results: list[RankResult]) -> int:
    """0 when every rank answered ok, 1 when none did (or there were none), 3 in between."""
    n_ok = sum(r.ok for r in results)
    if results and n_ok == len(results):
        return EXIT_OK
    return EXIT_PARTIAL if n_ok else EXIT_FAILURE


class Verdict(Protocol):
    """What every diagnosis returns (diagnose/): ``problem`` is set when it found one."""

    @property
    def problem(self) -> bool: ...


def verdict_exit_code(verdict: Verdict, results: list[RankResult]) -> int:
    """The one rule for diagnosis commands (hang, straggler, doctor): 4 when the verdict found a
    problem (a rank that did not answer can be the problem: the hang verdict blames it); else 3
    when some rank did not answer, so the all-clear covers only part of the job; else 0."""
    if verdict.problem:
        return EXIT_FINDING
    return EXIT_PARTIAL if any(not r.ok for r in results) else EXIT_OK


def verdict_outcome(
    session: Session, verdict: Verdict, results: list[RankResult], lines: list[str], *,
    summary: bool = True,
) -> Outcome:
    """A diagnosis command's Outcome: its rendered ``lines`` on stdout, the failure summary on
    stderr (unless ``summary`` is False: the hang verdict names silent ranks itself), and the
    exit code of ``verdict_exit_code``."""
    out = Outcome(stdout=lines, exit_code=verdict_exit_code(verdict, results))
    if summary:
        out.stderr = failure_summary(results, session.timeout, session.target_note)
    return out


def who(results: list[RankResult]) -> str:
    """``"0–3,7"``; ranks discovery could not tell appear by URL."""
    known = compact_ranges(r.rank for r in results if r.rank is not None)
    urls = [r.url for r in results if r.rank is None]
    return ", ".join(p for p in [known, *urls] if p)


def reason(r: RankResult) -> str:
    e = r.error
    if isinstance(e, RankError):
        return e.reason
    return str(e) if e is not None else "failed"


def failure_summary(
    results: list[RankResult], timeout: float, note: str | None = None
) -> list[str]:
    """stderr lines naming every rank that failed or stayed silent, then what to do.

    Partial: ``probe: 62/64 ranks answered; silent: 17,40 (timeout 5 s); failed: 3 (HTTP 401:
    ...)``. Nothing answered and one cause: that cause's own message. ``note`` (how the target
    was chosen when none was given) is added when nothing answered.
    """
    failed = [r for r in results if not r.ok]
    if not failed:
        return []
    n_ok = len(results) - len(failed)
    silent = [r for r in failed if r.silent]
    groups = group_by([r for r in failed if not r.silent], reason)
    parts = []
    if silent:
        parts.append(f"silent: {who(silent)} (timeout {timeout:g} s)")
    if groups:
        parts.append("failed: " + "; ".join(f"{who(list(g.members))} ({g.key})" for g in groups))
    if n_ok == 0 and len(failed) == 1 and failed[0].error is not None:
        lines = [f"probe: {failed[0].error.message}"]
    elif n_ok == 0 and all(isinstance(r.error, AgentHTTPError) for r in failed):
        # they answered: with an error each (bad SQL everywhere), which is not silence
        lines = [f"probe: every rank answered with an error ({len(failed)}); " + "; ".join(parts)]
    elif n_ok == 0:
        lines = ["probe: no rank answered; " + "; ".join(parts)]
    else:
        lines = [f"probe: {n_ok}/{len(results)} ranks answered; " + "; ".join(parts)]
    lines += [f"hint: {h}" for h in _hints(failed, lines[0])]
    if n_ok == 0 and note:
        lines.append(f"note: {note}")
    return lines


def _hints(failed: list[RankResult], already: str) -> list[str]:
    hints: list[str] = []
    for r in failed:
        h = r.error.help_text if isinstance(r.error, ProbeCLIError) else ""
        if h and h not in hints and h not in already:
            hints.append(h)
    return hints


Render = Callable[[list[RankResult]], list[str]]


def finish(
    session: Session,
    results: list[RankResult],
    render_ok: Render,
    *,
    render_failed: Render | None = None,
    as_json: bool | None = None,
) -> Outcome:
    """Results -> Outcome, the same way for every command.

    Args:
        render_ok: text lines for the ranks that answered ok (called only when some did and the
            output is not ``--json``, which always prints every rank's wire body).
        render_failed: extra stderr lines for the failed ranks, before the summary (eval uses
            it for tracebacks).
        as_json: print every rank's wire body as one JSON array; default: ``--json`` given.
    """
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    out = Outcome(exit_code=exit_code(results))
    if session.output == "json" if as_json is None else as_json:
        out.stdout.append(render_json(results))
    elif ok:
        out.stdout.extend(render_ok(ok))
    if failed and render_failed is not None:
        out.stderr.extend(render_failed(failed))
    out.stderr.extend(failure_summary(results, session.timeout, session.target_note))
    return out
