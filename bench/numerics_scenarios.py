"""The fault suite's training-numerics scenarios (tests/programs/numerics_job.py), imported by
bench/verdicts.py: a finite loss spike from one bad batch, a NaN born in one module on one rank
from one sample, an LR far too high (no clipping), far too low, a max_norm far too small, a
schedule that ended, and healthy runs that must stay quiet (plain, mixed precision, and a clip
that trims most updates a little while the loss falls: issue 45's false alarm).

Nothing is logged to the agent by the job: the loss and gradients are what it records itself.
Each scenario is scored as verdicts.py scores every other (the kinds each command must name and
nothing else), plus ``says``: text doctor's answer must hold (the rank, step, module, cause).
"""

from __future__ import annotations

from typing import Any

#: doctor's numerics checks -> verdict kinds (clipping's kind is its cause: verdicts.read)
KINDS = {"spike": "spike", "diverging": "diverging", "not_learning": "diverging",
         "stalled": "stalled", "lr_high": "lr", "clipping": "clipping", "lr_zero": "lr_zero",
         "guard": "guard"}


def numerics_scenarios(scenario: Any) -> list[Any]:
    """The scenarios, built with verdicts.py's ``Scenario`` (passed in: no import cycle)."""
    none: dict[str, frozenset[str]] = {"hang": frozenset(), "straggler": frozenset(),
                                       "doctor": frozenset()}

    def nm(name: str, doctor: tuple[str, ...] = (), **kw: Any) -> Any:
        kw.setdefault("ready_step", 130)
        return scenario(name, {**none, "doctor": frozenset(doctor)}, program="numerics_job.py",
                        step_s=0.01, trace="every:5", **kw)

    return [
        nm("num_healthy", healthy=True),
        nm("num_amp", healthy=True),
        nm("num_clip_mild", healthy=True, forbid_next="probe lr --scale"),
        # the bad batch comes at step 200 (numerics_job.py: at 70 it is no spike)
        nm("num_spike", ("spike",), ready_step=230,
           says=(("doctor", "LOSS SPIKE: rank 1 step 200"),)),
        nm("num_nan", ("nonfinite",),
           says=(("doctor", "first at step 70 on rank 1: produced in the forward of module "
                            "'0' (UnitNorm)"),)),
        nm("num_lr_high", ("lr",), allow=frozenset({"diverging", "spike", "nonfinite"})),
        nm("num_lr_low", ("stalled",), ready_step=160),
        nm("num_clip_small", ("clipping",), forbid_next="probe lr --scale",
           says=(("doctor", "raise max_norm"),)),
        nm("num_sched_end", ("lr_zero",), forbid_next="probe lr --scale 0.",
           says=(("doctor", "LR ZERO"),)),
    ]
