"""`probe doctor`'s verdict objects: a ``Finding`` (something to look at, with its evidence and
the next command to run), the ``Report`` that ranks them, and ``RankDoc``, what one rank
answered. Pure data; each check is in a module of its own (doctor.py lists them and the order
they run in), and render/doctor.py turns a Report into text or JSON.

Severity: ``critical`` (the job is stuck or its numbers are garbage: a hang, a stalled rank,
NaN/Inf, CUDA OOMs), ``warning`` (it runs, but worse than it should: a straggler, data-bound or
collective-bound steps, memory growing step over step, clipping on almost every step, a zero
or non-finite LR), ``info`` (the state worth knowing: learning rate and clipping, the slowest
modules by their own time; module times are attributions, so they inform, never alarm).
A report with any critical or warning finding has ``problem`` set (outcome.py: exit code 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

CRITICAL, WARNING, INFO = "critical", "warning", "info"
_ORDER = {CRITICAL: 0, WARNING: 1, INFO: 2}


@dataclass(slots=True)
class Finding:
    severity: str
    check: str
    title: str
    evidence: list[str] = field(default_factory=list)
    next: str = ""
    ranks: list[int] = field(default_factory=list)
    score: float = 0.0  # orders findings of one severity: bigger first
    detail: dict[str, Any] = field(default_factory=dict)  # a check's own numbers, for scripts

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"severity": self.severity, "check": self.check, "title": self.title,
                                "evidence": self.evidence, "next": self.next,
                                "ranks": self.ranks}
        if self.detail:
            body["detail"] = self.detail
        return body

    to_dict = to_json


@dataclass(slots=True)
class RankDoc:
    """What one rank answered to doctor's second round. A check's evidence (checks.py) is read
    with ``rows(key)``: a list of dicts (a canned query's rows) or None when that query failed;
    ``errors`` says why. The named fields hold the keys of the checks written before the
    registry (``rows`` reads them too); newer keys live in ``answers``."""

    rank: int
    state: dict[str, Any] | None = None
    grads: dict[str, Any] | None = None
    loop: list[dict[str, Any]] | None = None
    memory: list[dict[str, Any]] | None = None
    breakdown: list[dict[str, Any]] | None = None  # memory_breakdown rows
    activations: list[dict[str, Any]] | None = None  # memory_activations rows
    metrics: list[dict[str, Any]] | None = None
    slow: list[dict[str, Any]] | None = None
    throughput: list[dict[str, Any]] | None = None  # the throughput query's row
    schedule: list[dict[str, Any]] | None = None  # the schedule query's rows
    parallel: list[dict[str, Any]] | None = None  # the parallel query's row
    frames: tuple[dict[str, Any], ...] = ()
    #: its children as its watchdog read them (hang.RankState.children); () when not read
    children: tuple[dict[str, Any], ...] = ()
    collectives: tuple[dict[str, Any], ...] = ()
    errors: dict[str, str] = field(default_factory=dict)
    answers: dict[str, list[dict[str, Any]] | None] = field(default_factory=dict)

    def rows(self, key: str) -> list[dict[str, Any]] | None:
        """The rows of the evidence filed under ``key``; None when the rank gave none."""
        if key in _NAMED:
            return getattr(self, key)
        return self.answers.get(key)

    def file(self, key: str, rows: list[dict[str, Any]] | None) -> None:
        """File evidence under ``key`` (a named field when there is one)."""
        if key in _NAMED:
            setattr(self, key, rows)
        else:
            self.answers[key] = rows


#: Evidence keys with a field of their own on RankDoc (the rest go to ``answers``).
_NAMED = frozenset({"loop", "memory", "breakdown", "activations", "metrics", "slow",
                    "throughput", "schedule", "parallel"})


@dataclass(slots=True)
class Report:
    findings: list[Finding] = field(default_factory=list)
    fine: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)

    @property
    def problem(self) -> bool:
        return any(f.severity != INFO for f in self.findings)

    def ranked(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: (_ORDER[f.severity], -f.score))

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON form: ``problem``, ``findings`` (ranked, each ``Finding.to_json``),
        ``fine`` and ``unchecked`` (lists of one-line strings)."""
        return {"problem": self.problem, "findings": [f.to_json() for f in self.ranked()],
                "fine": self.fine, "unchecked": self.unchecked}


def num(v: Any) -> float | None:
    """A wire number (NaN and ±Inf arrive as strings) as float; None stays None."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, str):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(v)
    return float(v)


def first_loop(doc: RankDoc) -> dict[str, Any]:
    """The rank's one ``doctor_loop`` row (step time and loop counters), or an empty one."""
    return (doc.loop or [{}])[0]


def unrecorded(docs: list[RankDoc], key: str) -> str:
    """Why no rank answered the query behind ``key`` (the first error text), for "not checked"
    lines."""
    errs = sorted({d.errors.get(key, "") for d in docs} - {""})
    return errs[0] if errs else "no rank answered"
