"""BadSteps: what the numerics recorder (numerics.py) keeps of a step that went bad, on the
training thread before the optimizer runs.

- A loss spike or a non-finite loss or norm: the step's per-module gradient norms and its
  batches' DataLoader sample indices (``anomaly`` rows). Each costs a per-parameter norm pass,
  so at most ``MAX_ANOMALIES`` per run.
- The first non-finite step: its forward (and backward) re-run once to find where the value was
  born (nan_hunt.py; one ``origin`` row, and ``first_nonfinite`` for doctor). Under FSDP2 the
  re-run runs on every rank at once, only when the ranks agreed on the step (sharded.py).

The rows get the step's number when the step clock counts it (numerics_rows.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from .loss import LossMeter
from .module_stats import ModuleMap, module_grad_norms
from .nan_hunt import origin, origin_note
from .numerics_rows import NumericsRows
from .step_inputs import StepInputs, samples_text

#: Anomaly captures (per-module norms of a spike or non-finite step) kept per run.
MAX_ANOMALIES = 20


class BadSteps:
    def __init__(self, out: NumericsRows, inputs: StepInputs, loss: LossMeter) -> None:
        self.out, self.inputs, self.loss = out, inputs, loss
        self.anomalies = 0
        #: the first non-finite step and what the re-run found (doctor's evidence)
        self.first_nonfinite: dict[str, Any] | None = None

    def keep(self, torch: Any, module_map: Callable[[], ModuleMap | None], spike: float | None,
             nonfinite: bool, lf: float | None, gf: float | None, rerun: bool,
             collective: bool) -> ModuleMap | None:
        """Keep what this step calls for (``rerun``: every rank can re-run it; ``collective``:
        every rank re-runs it at once). Returns the module map when it was read."""
        mm = None
        if (spike or nonfinite) and self.anomalies < MAX_ANOMALIES:
            self.anomalies += 1
            mm = module_map()
            self._anomaly(torch, mm, spike, nonfinite)
        if nonfinite and self.first_nonfinite is None:
            mm = mm or module_map()
            self._hunt(torch, lf, gf, mm, rerun, collective)
        return mm

    def _anomaly(self, torch: Any, mm: ModuleMap | None, spike: float | None,
                 nonfinite: bool) -> None:
        now = time.time()
        samples = samples_text(self.inputs.batch_ids)
        what = "nonfinite" if nonfinite else f"spike x{spike:.2f}"
        self.out.add(now, None, "(total)", "anomaly", note=what, samples=samples)
        for name, g in module_grad_norms(torch, mm):
            self.out.add(now, None, name, "anomaly", grad_norm=g,
                         grad_nonfinite=not math.isfinite(g))

    def _hunt(self, torch: Any, lf: float | None, gf: float | None, mm: ModuleMap | None,
              rerun: bool, collective: bool) -> None:
        self.loss.paused = True  # the re-run's backward is not the step's loss
        try:
            info = origin(torch, mm, self.inputs.calls, self.inputs.batch_ids, lf, gf, rerun,
                          collective)
        finally:
            self.loss.paused = False
        info["step"] = None  # the clock's number, when it counts the step
        self.first_nonfinite = info
        self.out.add(time.time(), None, info.get("module") or "(none)", "origin",
                     stage=info.get("stage"), role=info.get("role"), op=info.get("op"),
                     samples=", ".join(str(s) for s in info.get("samples") or []) or None,
                     note=origin_note(info))
