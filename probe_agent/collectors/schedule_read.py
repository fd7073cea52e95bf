"""What an LR scheduler will do, in optimizer steps: where its warmup ends and where its decay
ends, read from its settings or measured from its LR function; and the total the job itself
declares (a framework's max_steps). Pure: objects in, a dict out; schedule.py calls it.

Read (exact) where the scheduler states it:

=======================  ===================================================================
OneCycleLR               warmup = pct_start x total_steps (its first phase), end total_steps;
                         stepping past the end raises ValueError in the job
CosineAnnealingLR        end T_max; the cosine rises again after it (it is periodic)
LinearLR                 total_iters: a warmup when the factor rises, else the decay's end
PolynomialLR             end total_iters (then constant)
ConstantLR               warmup-like: a lower factor for total_iters steps
MultiStepLR              end = the last milestone (then constant)
SequentialLR             its schedulers, each offset by the milestone it starts at
DeepSpeed WarmupLR,      warmup_num_steps, and total_num_steps where the class has one
WarmupDecayLR,
WarmupCosineLR
HF get_*_schedule_with   a LambdaLR over a ``functools.partial`` whose keywords are
_warmup                  num_warmup_steps and num_training_steps
=======================  ===================================================================

Measured for any other LambdaLR: its ``lr_lambda(step)`` is called for steps 0..horizon (the
HF ones and hand-written warmup+cosine lambdas are pure arithmetic; a lambda with side effects
would see them, a risk taken for the common case): warmup ends at the first maximum, the decay
at the first minimum after it, and past it the LR stays or rises (a cosine past its end climbs
again). A function that raises, or takes longer than ``PROBE_BUDGET_S``, leaves the schedule
"opaque"; so does MultiplicativeLR (its factors compound on the live LR). Steps are scheduler
steps; the caller records the scheduler's own count beside the optimizer's, so a per-epoch
scheduler shows.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

#: The longest a LambdaLR is probed for, on the training thread.
PROBE_BUDGET_S = 0.2
#: Steps probed at least (a schedule that ends later than the horizon reads "still decaying").
MIN_HORIZON = 10_000
MAX_HORIZON = 1_000_000


def describe(s: Any, horizon: int = MIN_HORIZON) -> dict[str, Any]:
    """``{scheduler, kind, method, warmup_steps, end_step, after_end, note}`` of one scheduler.

    kind: the shape ('warmup+decay', 'decay', 'warmup', 'constant', 'periodic' (restarts),
    'opaque');
    method: 'read' | 'measured' | 'opaque'; after_end: what the LR does past end_step
    ('constant', 'rises', 'raises': the scheduler raises in the job).
    """
    name = type(s).__name__
    out: dict[str, Any] = {"scheduler": name, "kind": None, "method": "read",
                           "warmup_steps": None, "end_step": None, "after_end": None, "note": None}
    # by class or a base class (a user's subclass of CosineAnnealingLR reads the same)
    reader = next((_READERS[c.__name__] for c in type(s).__mro__ if c.__name__ in _READERS),
                  None)
    try:
        if reader is not None:
            reader(s, out, horizon)
        elif hasattr(s, "lr_lambdas"):
            _lambda(s, out, horizon)
        elif hasattr(s, "warmup_num_steps"):  # DeepSpeed's WarmupLR family
            _deepspeed(s, out, horizon)
        else:
            out.update(method="opaque", kind="opaque",
                       note=f"{name}: no end to read (not a scheduler probe knows)")
    except Exception as e:  # noqa: BLE001 - a scheduler's odd state: say so, never raise
        out.update(method="opaque", kind="opaque", note=f"{name}: {type(e).__name__}: {e}")
    if out["kind"] is None:
        out["kind"] = _kind(out)
    return out


def _kind(out: dict[str, Any]) -> str:
    w, e = out["warmup_steps"], out["end_step"]
    if w and e is not None:
        return "warmup+decay"
    if w:
        return "warmup"
    return "decay" if e is not None else "constant"


def _onecycle(s: Any, out: dict[str, Any], horizon: int) -> None:
    phases = s._schedule_phases
    out.update(warmup_steps=int(round(float(phases[0]["end_step"]) + 1)),
               end_step=int(s.total_steps), after_end="raises",
               note="OneCycleLR raises ValueError when stepped past total_steps")


def _cosine(s: Any, out: dict[str, Any], horizon: int) -> None:
    out.update(end_step=int(s.T_max), after_end="rises")


def _linear(s: Any, out: dict[str, Any], horizon: int) -> None:
    if float(s.end_factor) >= float(s.start_factor):
        out.update(warmup_steps=int(s.total_iters))
    else:
        out.update(end_step=int(s.total_iters), after_end="constant")


def _poly(s: Any, out: dict[str, Any], horizon: int) -> None:
    out.update(end_step=int(s.total_iters), after_end="constant")


def _constant(s: Any, out: dict[str, Any], horizon: int) -> None:
    if float(s.factor) < 1:
        out.update(warmup_steps=int(s.total_iters))


def _multistep(s: Any, out: dict[str, Any], horizon: int) -> None:
    ms = sorted(s.milestones)
    if ms:
        out.update(end_step=int(ms[-1]), after_end="constant")


def _no_end(s: Any, out: dict[str, Any], horizon: int) -> None:
    out.update(note=f"{type(s).__name__} decays without an end")


def _restarts(s: Any, out: dict[str, Any], horizon: int) -> None:
    out.update(kind="periodic", note=f"restarts every {s.T_0} steps (x{s.T_mult} each time)")


def _sequential(s: Any, out: dict[str, Any], horizon: int) -> None:
    inner = [describe(x, horizon) for x in s._schedulers]
    starts = [0, *(int(m) for m in s._milestones)]
    names = [d["scheduler"] for d in inner]
    out["scheduler"] = f"SequentialLR({', '.join(names)})"
    if any(d["method"] == "opaque" for d in inner):
        out.update(method="opaque", kind="opaque", note="a scheduler inside is opaque")
        return
    if any(d["method"] == "measured" for d in inner):
        out["method"] = "measured"
    first = inner[0]
    # A first scheduler that only warms up (LinearLR rising, ConstantLR) is the warmup, and it
    # lasts until the next scheduler takes over.
    if first["warmup_steps"] and first["end_step"] is None and len(inner) > 1:
        out["warmup_steps"] = starts[1]
    elif first["warmup_steps"]:
        out["warmup_steps"] = first["warmup_steps"]
    last, start = inner[-1], starts[len(inner) - 1]
    if last["end_step"] is not None:
        out.update(end_step=start + int(last["end_step"]), after_end=last["after_end"])
    elif last["kind"] == "decay" or last["note"]:
        out["note"] = last["note"]


def _lambda(s: Any, out: dict[str, Any], horizon: int) -> None:
    fns = list(s.lr_lambdas)
    fn = fns[0]
    base = fn.func if isinstance(fn, functools.partial) else fn
    label = getattr(base, "__name__", type(base).__name__)
    out["scheduler"] = f"{type(s).__name__}({label})"
    if len({id(f) for f in fns}) > 1:
        out["note"] = "param groups have different lambdas: the first group's is shown"
    kw = fn.keywords if isinstance(fn, functools.partial) else {}
    if "num_warmup_steps" in kw and "num_training_steps" in kw:  # transformers' schedules
        out.update(warmup_steps=int(kw["num_warmup_steps"]),
                   end_step=int(kw["num_training_steps"]))
        out["after_end"] = _after(fn, out["end_step"])
        if "cosine" in label and "restarts" not in label and kw.get("num_cycles", 0.5) != 0.5:
            out["note"] = f"{kw.get('num_cycles')} cosine cycles"
        return
    if type(s).__name__ != "LambdaLR":
        out.update(method="opaque", kind="opaque",
                   note=f"{type(s).__name__}: its factors multiply, nothing to probe")
        return
    _measure(fn, out, horizon)


def _measure(fn: Any, out: dict[str, Any], horizon: int) -> None:
    """Probe ``fn`` over 0..horizon (see the module docstring)."""
    vals: list[float] = []
    end_by = time.perf_counter() + PROBE_BUDGET_S
    for step in range(horizon + 1):
        v = float(fn(step))
        if not math.isfinite(v):
            raise ValueError(f"lr_lambda({step}) = {v}")
        vals.append(v)
        if step % 100 == 99 and time.perf_counter() > end_by:
            out.update(method="opaque", kind="opaque",
                       note=f"lr_lambda too slow to probe ({step + 1} steps in "
                            f"{PROBE_BUDGET_S:g} s)")
            return
    out["method"] = "measured"
    top = max(vals)
    warm = vals.index(top)
    out["warmup_steps"] = warm if warm > 0 and vals[0] < top else None
    tail = vals[warm:]
    low = min(tail)
    eps = 1e-9 * max(abs(top), 1e-30)
    if top - low <= eps:
        return  # constant after the warmup
    end = warm + next(i for i, v in enumerate(tail) if v - low <= eps)
    if end >= horizon:
        out["note"] = f"still decaying at step {horizon} (the horizon probed)"
        return
    out["end_step"] = end
    out["after_end"] = "rises" if any(v - low > eps for v in vals[end:]) else "constant"


def _after(fn: Any, end: int) -> str | None:
    try:
        at = float(fn(end))
        later = [float(fn(end + d)) for d in (1, 10, 100, max(end // 2, 1))]
    except Exception:  # noqa: BLE001 - the reading stands without it
        return None
    return "rises" if any(v > at + 1e-9 for v in later) else "constant"


def _deepspeed(s: Any, out: dict[str, Any], horizon: int) -> None:
    out["warmup_steps"] = int(s.warmup_num_steps)
    total = getattr(s, "total_num_steps", None)
    if total is not None:
        out.update(end_step=int(total), after_end="constant")


_READERS = {
    "OneCycleLR": _onecycle, "CosineAnnealingLR": _cosine, "LinearLR": _linear,
    "PolynomialLR": _poly, "ConstantLR": _constant, "MultiStepLR": _multistep,
    "StepLR": _no_end, "ExponentialLR": _no_end, "SequentialLR": _sequential,
    "CosineAnnealingWarmRestarts": _restarts,
}


def job_total(framework: str, trainer: Any) -> tuple[int | None, str | None]:
    """The optimizer steps the job says it will run, and where that was read."""
    if trainer is None:
        return None, None
    try:
        if framework == "hf_trainer":
            state = getattr(getattr(trainer, "state", None), "max_steps", 0) or 0
            if int(state) > 0:
                return int(state), "Trainer.state.max_steps"
            args = getattr(getattr(trainer, "args", None), "max_steps", 0) or 0
            if int(args) > 0:
                return int(args), "TrainingArguments.max_steps"
        elif framework.startswith("lightning"):
            ms = getattr(trainer, "max_steps", -1)
            if ms is not None and int(ms) > 0:
                return int(ms), "Trainer.max_steps"
            est = trainer.estimated_stepping_batches
            if est is not None and math.isfinite(float(est)) and float(est) > 0:
                return int(est), "Trainer.estimated_stepping_batches"
    except Exception:  # noqa: BLE001 - a framework's property that cannot answer now
        return None, None
    return None, None
