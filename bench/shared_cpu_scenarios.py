"""The fault suite's CPU-sharing scenarios (tests/programs/shared_cpu_job.py), imported by
bench/verdicts.py: on a machine busy with other work, ranks that share every core with no
pinning must get no straggler verdict (which one waits for a CPU is the scheduler's pick), while
a rank that computes more than the others on those same cores, and a rank pinned to a CPU of its
own that another process keeps busy, must be named.

``hog``: verdicts.py starts one busy process per core beside the job (cpu_pinned starts its own,
pinned to the odd rank's CPU).
"""

from __future__ import annotations

from typing import Any


def shared_cpu_scenarios(scenario: Any) -> list[Any]:
    """The scenarios, built with verdicts.py's ``Scenario`` (passed in: no import cycle)."""
    none: dict[str, frozenset[str]] = {"hang": frozenset(), "straggler": frozenset(),
                                       "doctor": frozenset()}
    named = {**none, "straggler": frozenset({"straggler"}), "doctor": frozenset({"straggler"})}

    def cpu(name: str, expect: dict[str, frozenset[str]], **kw: Any) -> Any:
        return scenario(name, expect, program="shared_cpu_job.py", step_s=0.005,
                        ready_step=100, **kw)

    return [
        cpu("cpu_shared", none, hog=True, healthy=True),
        cpu("cpu_compute", named, hog=True),
        cpu("cpu_pinned", named),
    ]
