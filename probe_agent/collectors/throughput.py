"""The throughput columns of ``python.steps``: tokens, FLOPs (measured and 6·N·tokens), the
peak and MFU of each optimizer step. The step recorder calls it; it owns no table.

Where each number comes from
----------------------------
- tokens: ``probe_agent.log(tokens=N)`` for that step (summed when logged per micro-batch),
  else B x T of the root model's integer inputs summed over the step's micro-batches
  (tracer/batch.py) on traced steps. Untraced steps carry the last traced step's batch while no
  traced step says otherwise (``tokens_source`` 'carried'), so tokens/s exists on every step,
  not only on the slower traced ones.
- flops: the FlopMeter's measured step (flops.py) as measured; other steps scale it by their
  tokens (FLOPs per token measured once, times this step's tokens), or repeat it when no
  tokens are known. ``flops_6n`` is 6 x trainable parameters x tokens, the usual estimate.
- peak_flops: peak.py for the device and dtype the step ran in (autocast included).
- mfu = flops / duration / peak_flops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .flops import FlopMeter, trainable_params
from .peak import PeakFlops
from .tracer.batch import StepBatch

#: Column names, in python.steps' order after ``traced`` (schema.sql).
COLUMNS = ("tokens", "tokens_per_s", "tokens_source", "micro_batches", "context_len",
           "flops", "flops_measured", "flops_6n", "flops_per_s", "compute_dtype",
           "peak_flops", "peak_source", "mfu")
NONE_ROW: tuple[Any, ...] = (None,) * len(COLUMNS)


@dataclass
class StepWork:
    """What is known at the step boundary; logged tokens may still come."""

    tokens: int | None
    source: str | None
    micro_batches: int | None
    context: int | None
    flops: float | None  # measured on this step, else None
    params: int | None
    dtype: str | None
    peak: tuple[float, str] | None
    device: str | None = None


class ThroughputMeter:
    """Per-rank state: the last traced batch, the FLOP meter, the peak.

    Args:
        run_dir: where a measured CPU peak is shared on the node (peak.py).
    """

    def __init__(self, run_dir: str) -> None:
        self.meter = FlopMeter()
        self.peaks = PeakFlops(run_dir)
        self._batch: StepBatch | None = None
        self._params: int | None = None
        self._per_token: float | None = None  # measured FLOPs / tokens of the measured step
        self._flops: float | None = None  # the measured step's FLOPs

    def at_step(self, torch: Any, step: int, optimizer: Any, batch: StepBatch | None,
                tracer: Any) -> StepWork:
        """Training thread, right after optimizer step ``step``."""
        source = None
        if batch is not None and batch.micro_batches:
            self._batch = batch
            source = "inputs"
        elif self._batch is not None:
            source = "carried"
        b = self._batch
        shapes = tuple(batch.shapes) if batch is not None and batch.shapes else None
        mode = str(getattr(tracer, "mode", "off"))
        next_traced = bool(tracer is not None and tracer.traced(step + 1))
        # Only while no step is being counted: on CPU the first call measures the peak with
        # matmuls, which a FLOP counter on the stack would count as that step's (~70x-100x its
        # FLOPs): before the boundary the measured step's counter may still be on, after it
        # the next step's may be. When both are, the peak waits for a later boundary.
        peak = None
        if b is not None and not self.meter.measuring:
            peak = self.peaks.get(torch, b.device, b.dtype)
        flops = self.meter.boundary(torch, step, shapes, next_traced, mode != "off")
        if peak is None and b is not None and not self.meter.measuring:
            peak = self.peaks.get(torch, b.device, b.dtype)
        if flops is not None or self._params is None:
            params = tracer.boundaries.trained_params(optimizer) if tracer is not None else [
                p for g in getattr(optimizer, "param_groups", ()) for p in g.get("params", ())]
            self._params = trainable_params(params) or None
        return StepWork(
            tokens=b.tokens if b is not None else None, source=source if b else None,
            micro_batches=b.micro_batches if b is not None else None,
            context=b.context if b is not None else None, flops=flops, params=self._params,
            dtype=b.dtype if b is not None else None, peak=peak,
            device=b.device if b is not None else None)

    def columns(self, work: StepWork | None, logged: int | None,
                duration: float | None) -> tuple[Any, ...]:
        """The COLUMNS values once the step's logged tokens are in (whoever finishes it)."""
        if work is None:
            return NONE_ROW
        tokens, source = work.tokens, work.source
        if logged is not None:
            tokens, source = logged, "logged"
        measured = work.flops is not None
        if work.flops is not None:
            self._flops = work.flops
            self._per_token = work.flops / tokens if tokens else None
        if measured:
            flops = work.flops
        elif self._per_token is not None and tokens:
            flops = self._per_token * tokens
        else:
            flops = self._flops
        f6n = 6.0 * work.params * tokens if work.params and tokens else None
        per_s = flops / duration if flops and duration else None
        if per_s and work.peak and per_s > work.peak[0]:
            work.peak = self.peaks.at_least(work.device, work.dtype, per_s)
        peak, peak_source = work.peak if work.peak else (None, None)
        mfu = per_s / peak if per_s and peak else None
        tps = tokens / duration if tokens and duration else None
        return (tokens, tps, source, work.micro_batches, work.context, flops, measured, f6n,
                per_s, work.dtype, peak, peak_source, mfu)
