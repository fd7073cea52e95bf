"""``Verdict``: what every single-question diagnosis returns (hang, straggler), and what the
outcome rule reads (``problem`` -> exit code 4, outcome.py). Each diagnosis subclasses it with
its own evidence; ``to_json`` lists the shared keys first, so every verdict's ``--json`` starts
the same way."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Verdict:
    problem: bool
    headline: str
    details: list[str] = field(default_factory=list)
    #: ranks the verdict blames (odd, failed, silent or slow), for --json and tests.
    culprits: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"problem": self.problem, "headline": self.headline, "details": self.details,
                "culprits": self.culprits}

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON form (the subclass's ``to_json``): what `--json` prints and the
        dashboard renders."""
        return self.to_json()
