"""CUDA events and allocator reads for the tracer's CUDA steps (the Python hot path).

A traced CUDA step records a pair of events around each module call and one event per backward
event, never synchronising: the writer reads their times once the end event has completed
(``trace_rows.py``), and returns them here for reuse (``recycle``).
"""

from __future__ import annotations

from typing import Any

from .trace_columns import pack_bw


class CudaRecords:
    """Mixed into ``TorchTracer``: needs its ``_torch``, ``clock``, ``bw``, ``bcuda`` and
    ``_events`` (the pool of spare events)."""

    _torch: Any
    clock: Any
    bw: Any
    bcuda: list[Any]
    _events: list[Any]

    def record_bw_cuda(self, gseq: int, memory: bool) -> None:
        """One backward event on a CUDA step: node ``gseq`` (or PASS_END) with a CUDA event,
        and the allocator's numbers when ``memory``, in ``bcuda``."""
        t = self.clock()
        cuda = 0
        ev = self.record_event()
        if ev is not None:
            self.bcuda.append((ev, self.memory() if memory else None))
            cuda = 1
        self.bw.frombytes(pack_bw(t, gseq, cuda))

    def record_event(self) -> Any:
        """A recorded CUDA event from the pool, or None during stream capture."""
        torch = self._torch
        if torch.cuda.is_current_stream_capturing():
            return None
        ev = self._events.pop() if self._events else torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def memory(self) -> tuple[float, float, float, float] | None:
        """(allocated, max_allocated, cached, max_cached) in MiB on the current CUDA device."""
        torch = self._torch
        s = torch._C._cuda_memoryStats(torch.cuda.current_device())
        a, r = s["allocated_bytes"]["all"], s["reserved_bytes"]["all"]
        mib = 1 / (1 << 20)
        return (a["current"] * mib, a["peak"] * mib, r["current"] * mib, r["peak"] * mib)

    def recycle(self, events: list[Any]) -> None:
        """Events whose times were read go back to the pool (writer thread)."""
        if len(self._events) < 4096:
            self._events.extend(events)
