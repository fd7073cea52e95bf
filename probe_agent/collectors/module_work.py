"""Per-module work of the FLOP-measured step: FLOPs, aten ops and the host time inside them.

The FLOP meter (flops.py) already runs one step under a dispatch mode; here that mode also
times each op and attributes it to the innermost module whose ``forward`` is on the training
thread's Python stack (a frame walk per op: the measured step is slow anyway, and it is one
step in hundreds). Backward and optimizer ops run with no ``forward`` frame above them: they
go to ``None`` (outside modules). What it answers:

- a module with most of a step's time and almost none of its FLOPs and op time is waiting on
  host code in its forward (a Python loop, I/O, a sleep), not computing
  (probe_cli/diagnose/levers.py);
- ops per step and the time per op tell "many small ops" (per-op overhead: fusion,
  torch.compile) from a step of few large ones.

Why not torch's ModuleTracker (FlopCounterMode's own per-module view): it installs global
module hooks for the whole step, which send every module call through the slow path and which
torch.compile warns about (flops.py).
"""

from __future__ import annotations

import sys
import time
from typing import Any

_perf_ns = time.perf_counter_ns


def _owner(frame: Any, forward_codes: dict[Any, bool], module_type: Any) -> Any:
    """The innermost ``nn.Module`` whose ``forward`` is running at ``frame`` (or None)."""
    while frame is not None:
        code = frame.f_code
        is_fwd = forward_codes.get(code)
        if is_fwd is None:
            is_fwd = forward_codes[code] = code.co_name == "forward" and \
                code.co_argcount >= 1 and code.co_varnames[0] == "self"
        if is_fwd:
            obj = frame.f_locals.get("self")
            if isinstance(obj, module_type):
                return obj
        frame = frame.f_back
    return None


def timed_dispatch(mode: Any, dispatch: Any, func: Any, types: Any, args: Any,
                   kwargs: Any) -> Any:
    """The mode's ``__torch_dispatch__`` around ``dispatch``: the outermost op of a
    decomposition is counted once, with its time and owner."""
    counter = mode.counter
    if counter.depth:
        return dispatch(func, types, args, kwargs)
    owner = _owner(sys._getframe(2), counter.forward_codes, counter.module_type)
    counter.owner = owner
    counter.depth += 1
    t0 = _perf_ns()
    try:
        return dispatch(func, types, args, kwargs)
    finally:
        counter.depth -= 1
        key = id(owner) if owner is not None else None
        work = counter.work.get(key)
        if work is None:
            work = counter.work[key] = [owner, 0.0, 0, 0]
        work[2] += 1
        work[3] += _perf_ns() - t0


def module_counter_class() -> Any:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    class ModuleFlopCounter(FlopCounterMode):
        """Counts as FlopCounterMode does (its "Global" total) and per owning module."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.depth = 0
            self.owner: Any = None
            self.forward_codes: dict[Any, bool] = {}
            self.module_type = torch.nn.Module
            # id(module) or None -> [module, flops, ops, op_ns]
            self.work: dict[int | None, list[Any]] = {}

        def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            fn = self.flop_registry.get(func_packet)
            if fn is not None:
                n = fn(*args, **kwargs, out_val=out)
                self.flop_counts["Global"][func_packet] += n
                owner = self.owner
                key = id(owner) if owner is not None else None
                work = self.work.get(key)
                if work is None:
                    work = self.work[key] = [owner, 0.0, 0, 0]
                work[1] += n
            return out

        def by_module(self, torch_mod: Any) -> list[tuple[str | None, float, int, float]]:
            """[(module name or None, flops, ops, op_ms)], names as the tracer gives them."""
            from .model_scan import ModelScan

            work, self.work = self.work, {}
            if not work:
                return []
            scan = ModelScan(torch_mod)
            out = []
            for owner, flops, ops, ns in work.values():
                name = scan.name(owner) if owner is not None else None
                out.append((name, float(flops), int(ops), ns / 1e6))
            return out

    return ModuleFlopCounter
