"""How a `probe doctor` check declares itself: ``DoctorCheck`` (its name, its place in the run,
what it does, and the canned queries it reads on every rank), ``Evidence`` (one such query) and
``Context`` (what a check is given). Pure.

Each check module ends in ``CHECKS = (DoctorCheck(...), ...)``; doctor.py's ``DEFAULT_CHECKS``
lists the modules (datasette's ``DEFAULT_PLUGINS``). The second round of `probe doctor` asks
every rank for the union of the checks' evidence (gather/evidence.py) and files each answer
under its key in the rank's ``RankDoc``, where the check reads it (``doc.rows(key)``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .findings import RankDoc, Report
from .hang import HangVerdict


def no_params(_last: int) -> dict[str, Any]:
    return {}


@dataclass(frozen=True, slots=True)
class Evidence:
    """A canned query (sql/queries/<query>.sql) asked of every rank; its records land in
    ``RankDoc.rows(key)`` (None when the rank could not answer it: ``errors[key]`` says why).

    Args:
        key: where the rows are filed; two checks that name the same key share one query.
        query: the canned query's name.
        params: its parameters from doctor's ``--last`` (the look-back every canned query
            takes).
    """

    key: str
    query: str
    params: Callable[[int], dict[str, Any]] = no_params


@dataclass(frozen=True, slots=True)
class Context:
    """What a check is given: the hang verdict of the first round, every rank's evidence, and
    the wait that counts as stuck (``--min-wait`` or the job's own rhythm)."""

    verdict: HangVerdict
    docs: list[RankDoc]
    min_wait: float


@dataclass(frozen=True, slots=True)
class DoctorCheck:
    """One check of `probe doctor`.

    Args:
        name: names the check in --json (``Finding.check``) and in the docs.
        order: where it runs, smallest first (gaps of 10 leave room): one problem must not
            hide behind another (a hang first; timings after it would describe the past).
        run: adds findings, ``fine`` and ``unchecked`` lines to the report; reads
            ``ctx.report``'s earlier findings when it defers to them.
        evidence: the canned queries it reads.
    """

    name: str
    order: int
    run: Callable[[Report, Context], None]
    evidence: tuple[Evidence, ...] = field(default=())
