"""The rows of ``python.numerics``: made on the training thread during a step (held until the
step clock gives the step its number: the first step's may come from the optimizer's own
count), then buffered, and turned into one Arrow table per flush on the writer thread. A traced
step's per-module numbers ride as one ``module-stats`` row holding the ``StepStats`` until the
flush, so reading them off the device happens on the writer thread, not the training thread.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa

TABLE = "python.numerics"
#: Rows buffered between flushes at most (a writer that fell behind drops the rest).
BUFFER = 100_000
#: Rows one step may hold at most.
HELD = 10_000


class NumericsRows:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.rows: list[tuple[Any, ...]] = []
        self.held: list[tuple[Any, ...]] = []  # this step's (training thread only)

    def add(self, ts: float, step: int | None, module: str, kind: str, grad_norm: Any = None,
            weight_norm: Any = None, ratio: Any = None, act: Any = None,
            grad_nonfinite: Any = None, act_nonfinite: Any = None, clip_max: Any = None,
            stage: Any = None, role: Any = None, op: Any = None, samples: Any = None,
            note: Any = None) -> None:
        if len(self.held) < HELD:
            self.held.append((ts, step, module, kind, grad_norm, weight_norm, ratio, act,
                              act_nonfinite, grad_nonfinite, clip_max, stage, role, op,
                              samples, note))

    def stamp(self, step: int) -> None:
        """The step's held rows get its number and go to the buffer."""
        held, self.held = self.held, []
        if len(self.rows) < BUFFER:
            self.rows.extend((r[0], step if r[1] is None else r[1], *r[2:]) for r in held)

    def table(self, schema: pa.Schema) -> pa.Table | None:
        """Writer thread: the buffered rows as one table (None when there are none)."""
        n = len(self.rows)
        if not n:
            return None
        rows, self.rows[:n] = self.rows[:n], []
        out = []
        for r in rows:
            if r[3] == "module-stats":
                stats = r[-1]  # the StepStats rides in the note field until here
                for name, g, w, ratio, act in stats.rows():
                    out.append((r[0], r[1], name, "module", g, w, ratio, act,
                                act is not None and not math.isfinite(act),
                                g is not None and not math.isfinite(g),
                                None, None, None, None, None, None))
            else:
                out.append(r)
        cols = list(zip(*out))
        return pa.table([cols[0], [self.rank] * len(out), *cols[1:4],
                         *[[to_float(v) for v in c] for c in cols[4:8]], *cols[8:]],
                        schema=schema)


def to_float(v: Any) -> float | None:
    """A number or a 0-dim tensor as a float (NaN when it cannot be read)."""
    if v is None:
        return None
    try:
        return float(v.item() if hasattr(v, "item") else v)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return math.nan
