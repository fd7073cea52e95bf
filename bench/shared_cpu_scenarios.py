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
        kw.setdefault("ready_step", 100)
        return scenario(name, expect, program="shared_cpu_job.py", step_s=0.005, **kw)

    return [
        cpu("cpu_shared", none, hog=True, healthy=True),
        # judged once the window holds steady steps: read at step 100, doctor's 20% bar was
        # missed 1 time in 4 over a window that began with the start-up (144 collectives)
        cpu("cpu_compute", named, hog=True, ready_step=160),
        cpu("cpu_pinned", named),
    ]
