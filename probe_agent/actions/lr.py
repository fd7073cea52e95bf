"""`probe lr --scale F | --set LR`: change the learning rate so that it survives the schedulers.

Runs on the training thread right after optimizer step N (a step-boundary action), so the new LR
is in place before the program's own ``scheduler.step()`` of that iteration.

Every param group of every optimizer seen stepping gets ``lr *= f`` (``--set`` uses, per group,
``f = new / old``). Setting ``group["lr"]`` alone is undone by any scheduler that recomputes the
LR from its base values, so each scheduler of those optimizers is rescaled by the same ``f``:

=========================================  ==================================================
scheduler                                  what is scaled, and why it survives
=========================================  ==================================================
StepLR, MultiStepLR, ExponentialLR,        chainable: the next LR is computed from the
ConstantLR, LinearLR, PolynomialLR,        current ``group["lr"]``, so scaling it is enough;
MultiplicativeLR                           ``base_lrs`` (used by the closed form, step(epoch))
                                           are scaled too, to stay consistent
LambdaLR                                   recomputes ``base_lr * lambda(epoch)`` every step:
                                           ``base_lrs`` is what carries the change
CosineAnnealingLR,                         recursive/closed form in ``base_lrs`` and
CosineAnnealingWarmRestarts                ``eta_min``: both scaled, so the rest of the curve
                                           is exactly ``f`` times the original one
OneCycleLR                                 computes from the groups' ``initial_lr``,
                                           ``max_lr`` and ``min_lr``: all three scaled
CyclicLR                                   ``base_lrs`` and ``max_lrs`` scaled
ReduceLROnPlateau                          reduces ``group["lr"]`` itself; ``min_lrs`` scaled
                                           so the floor moves with it
SequentialLR, ChainedScheduler             each scheduler inside is found and scaled as above
DeepSpeed WarmupLR, WarmupDecayLR          ``min_lrs``, ``max_lrs`` and ``delta_lrs``: the LR is
                                           ``min + delta * gamma(step)``
DeepSpeed WarmupCosineLR                   ``org_lrs`` (the LR is ``org_lr * ratio(step)``)
DeepSpeed OneCycle                         ``min_lrs`` and ``max_lrs`` (cycle and decay)
=========================================  ==================================================

A scheduler belongs to an optimizer through wrappers: the HF Trainer's LambdaLR holds the
``AcceleratedOptimizer``, whose ``.optimizer`` is the one that steps (frameworks/unwrap.py).
Before reporting success, each scheduler's next step is simulated with and without the change
(lr_holds.py): a scheduler that would put the old LR back makes the change refused and undone.

Every group's ``initial_lr`` (set by any scheduler) is scaled too, so a scheduler created later
with ``last_epoch`` starts from the changed LR. A scalar ``eta_min`` is scaled only when every
group got the same factor (always with ``--scale``); otherwise it is left and the result says so.
A tensor LR (``capturable``/fused optimizers) is updated in place.

Refused, before anything changes: a value that is not a finite number, a negative one,
and an LR the parameters' dtype cannot hold (``optimizer.step()`` would raise in the training
loop) always; zero (training stops, and schedulers' base LRs stay 0 for good) and any change
that makes an LR more than ``MAX_FACTOR`` times the current largest one (``lr --set 1e30`` made
every parameter non-finite) unless ``force``. ``check_request`` and ``check_bound`` run when
the action is submitted (a 400 at once) and again in ``change_lr`` at the step boundary, where
the LRs may have moved.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from ..errors import ProbeAgentError
from .lr_holds import judge, predict_next, restore, snapshot

#: How many times the current largest LR a change may reach without ``force``.
MAX_FACTOR = 10.0
_FORCE = 'pass --force (API: "force": true) if you mean it'
#: Scheduler attributes holding one LR per param group: torch's, and DeepSpeed's (WarmupLR,
#: WarmupDecayLR: ``min_lrs + delta_lrs * gamma``; WarmupCosineLR: ``org_lrs * ratio``;
#: OneCycle: between ``min_lrs`` and ``max_lrs``, then ``min_lrs`` decayed).
_LIST_ATTRS = ("base_lrs", "max_lrs", "min_lrs", "delta_lrs", "org_lrs")
#: How far below the parameters' dtype limit an LR must stay: the largest factor torch.optim
#: applies to the LR before using it (Adam/AdamW's bias correction, 1 / (1 - beta1) at most).
_LR_HEADROOM = 1000.0
#: Param-group keys that schedulers read LRs from.
_GROUP_KEYS = ("initial_lr", "max_lr", "min_lr")


class LRError(ProbeAgentError, ValueError):
    """An LR change refused before anything changed (HTTP 400)."""

    status = 400


def _num(v: Any) -> float:
    return float(v.item()) if hasattr(v, "item") else float(v)


def _flag(scale: float | None, set_to: float | None) -> str:
    name, v = ("--scale", scale) if scale is not None else ("--set", set_to)
    shown = f"{v:g}" if isinstance(v, numbers.Real) and not isinstance(v, bool) else repr(v)
    return f"{name} {shown}"


def check_request(scale: float | None, set_to: float | None, force: bool = False) -> None:
    """The rules that need no optimizer: finite, not negative; zero or a scale above
    ``MAX_FACTOR`` only with ``force``. Raises LRError with what to do."""
    for value in (scale, set_to):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise LRError(f"lr {_flag(scale, set_to)} refused: give a number, not "
                          f"{type(value).__name__}")
        if not math.isfinite(value):
            raise LRError(f"lr {_flag(scale, set_to)} refused: give a finite number > 0")
        if value < 0:
            raise LRError(f"lr {_flag(scale, set_to)} refused: a learning rate cannot be "
                          "negative; give a number > 0")
        if value == 0 and not force:
            raise LRError(f"lr {_flag(scale, set_to)} refused: an LR of 0 stops training and "
                          "schedulers cannot scale it back; " + _FORCE)
    if scale is not None and scale > MAX_FACTOR and not force:
        raise LRError(f"lr --scale {scale:g} refused: more than {MAX_FACTOR:g}x the current "
                      "LR; " + _FORCE)


def _peek(v: Any) -> float | None:
    """An LR's value, or None for a tensor off the CPU (reading it from an agent thread would
    wait on the training stream; the step-boundary check reads it)."""
    device = getattr(v, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        return None
    return _num(v)


def check_bound(optimizers: list[Any], set_to: float | None, force: bool = False) -> None:
    """Refuse ``--set`` above ``MAX_FACTOR`` times the largest current LR, unless ``force``."""
    if set_to is None or force or not optimizers:
        return
    current = [(x, f"{type(o).__name__}[{i}]") for i, o in enumerate(optimizers)
               for g in o.param_groups if (x := _peek(g["lr"])) is not None]
    if not current:
        return
    largest, where = max(current, key=lambda c: c[0])
    if set_to > MAX_FACTOR * largest:
        times = f"{set_to / largest:.3g}x" if largest > 0 else "infinitely many times"
        raise LRError(f"lr --set {set_to:g} refused: {times} the current largest LR "
                      f"({largest:.6g}, {where}), above the {MAX_FACTOR:g}x bound; " + _FORCE)


def _set_group(group: dict[str, Any], key: str, value: float) -> None:
    cur = group[key]
    if hasattr(cur, "fill_"):
        cur.fill_(value)  # a tensor LR: keep the tensor (fused/capturable steps hold it)
    else:
        group[key] = value


def check_args(optimizers: list[Any], args: dict[str, Any]) -> None:
    """The submit-time check of an ``lr`` action's arguments (``POST /v1/actions``)."""
    force = bool(args.get("force"))
    check_request(args.get("scale"), args.get("set"), force)
    check_bound(optimizers, args.get("set"), force)


def change_lr(
    optimizers: list[Any], schedulers: list[Any], *, scale: float | None = None,
    set_to: float | None = None, force: bool = False, names: dict[int, str] | None = None,
) -> dict[str, Any]:
    """Scale or set every LR; returns what changed (JSON-safe) for the per-rank report.

    Each scheduler's next step is simulated before and after (lr_holds.py); if one would undo
    the change, everything is put back and LRError says why.

    Args:
        names: ``id(obj) -> how to reach it`` (``trainer.lr_scheduler``), for the report.
        force: allow zero and changes above ``MAX_FACTOR`` times the current largest LR. A
            non-finite or negative value, or one the parameters' dtype cannot hold, is refused
            even so.
    """
    if (scale is None) == (set_to is None):
        raise LRError("give exactly one of scale or set")
    check_request(scale, set_to, force)
    check_bound(optimizers, set_to, force)
    _check_applicable(optimizers, scale, set_to)
    saved = snapshot(optimizers, schedulers)
    predicted = {id(s): predict_next(s) for s in schedulers}
    report: dict[str, Any] = {"optimizers": [], "schedulers": []}
    factors: dict[int, list[float]] = {}  # id(optimizer) -> factor per group
    for i, opt in enumerate(optimizers):
        groups, fs = [], []
        for g in opt.param_groups:
            before = _num(g["lr"])
            if set_to is None:
                f = float(scale) if scale is not None else 1.0
                after = before * f
            else:
                f = set_to / before if before else float("nan")
                after = set_to
            _set_group(g, "lr", after)
            for key in _GROUP_KEYS if f == f else ():  # f is NaN when --set met an LR of 0
                if isinstance(g.get(key), numbers.Real) or hasattr(g.get(key), "item"):
                    _set_group(g, key, _num(g[key]) * f)
            fs.append(f if f == f else 1.0)
            groups.append({"before": before, "after": _num(g["lr"])})
        factors[id(opt)] = fs
        report["optimizers"].append({"index": i, "class": type(opt).__name__, "groups": groups})
    mine = [(s, factors[id(stepping_optimizer(s))]) for s in schedulers
            if id(stepping_optimizer(s)) in factors]
    for s, fs in mine:
        report["schedulers"].append(_rescale_scheduler(s, fs))
    for (s, fs), entry in zip(mine, report["schedulers"]):
        verdict, line = judge(predicted[id(s)], predict_next(s), fs)
        entry["holds"] = verdict
        entry["notes"].append(line)
        if names and id(s) in names:
            entry["where"] = names[id(s)]
        if verdict == "undone":
            restore(saved)
            raise LRError(
                f"lr {_flag(scale, set_to)} refused: {type(s).__name__} "
                f"({entry.get('where', 'the job scheduler')}) computes the LR from values probe "
                f"cannot scale ({line}); nothing was changed; change the schedule in the "
                "training script, or set the variable it reads with probe eval")
    if not mine:
        report["notes"] = [
            "no LR scheduler steps these optimizers: whether the training loop keeps the new "
            "LR (or sets its own each step, like nanoGPT's get_lr) is checked at the next step"]
    return report


def stepping_optimizer(s: Any) -> Any:
    """The optimizer that steps behind a scheduler's ``.optimizer`` (Accelerate, Lightning
    and DeepSpeed hand schedulers their wrapper)."""
    from ..frameworks import unwrap

    return unwrap.optimizer(getattr(s, "optimizer", None))


def _largest_lr(group: dict[str, Any]) -> float:
    """The largest LR the optimizer can apply to this group's parameters.

    Optimizers pass the LR as a scalar of the parameter's dtype (``param.add_(g, alpha=-lr)``),
    so an LR above that dtype's largest finite value makes the next ``optimizer.step()`` raise
    "value cannot be converted ... without overflow" in the training loop (found by fuzzing an
    LR of 1.8e308 into float32 parameters). Some multiply it first: Adam's step size is
    ``lr / (1 - beta1**t)``, up to 1000x the LR for beta1 = 0.999 (Adam at lr=1e38 crashes on
    float32). Hence ``_LR_HEADROOM``: float32 LRs up to 3.4e35, float16 up to 65.
    """
    import torch  # only reached with optimizers, which means torch is loaded

    limits = [torch.finfo(p.dtype).max / _LR_HEADROOM for p in group.get("params", ())
              if getattr(p, "is_floating_point", lambda: False)()]
    return min(limits, default=math.inf)


def _check_applicable(optimizers: list[Any], scale: float | None, set_to: float | None) -> None:
    """Refuse, before changing anything, an LR that would crash the training loop."""
    for opt in optimizers:
        for g in opt.param_groups:
            if set_to is not None:
                after = set_to
            elif scale is not None:
                after = _num(g["lr"]) * scale
            else:
                return  # neither: the request changes no LR
            limit = _largest_lr(g)
            if not after <= limit:
                raise LRError(
                    f"lr {after:.6g} refused for {type(opt).__name__}: above {limit:.6g}, the "
                    "largest LR its step can apply in its parameters' dtype (optimizer.step() "
                    "would overflow); nothing was changed; give an LR below that limit"
                )


def _rescale_scheduler(s: Any, fs: list[float]) -> dict[str, Any]:
    changed, notes = [], []
    for attr in _LIST_ATTRS:
        values = getattr(s, attr, None)
        if isinstance(values, list) and len(values) == len(fs):
            setattr(s, attr, [v * f if isinstance(v, numbers.Real) or hasattr(v, "item")
                              else v for v, f in zip(values, fs)])
            changed.append(attr)
    eta = getattr(s, "eta_min", None)
    if isinstance(eta, numbers.Real) and eta:
        if len(set(fs)) == 1:
            s.eta_min = eta * fs[0]
            changed.append("eta_min")
        else:
            notes.append("eta_min left as is: the groups got different factors")
    if hasattr(s, "_schedulers"):
        notes.append("the schedulers inside were rescaled themselves")
    last = getattr(s, "_last_lr", None)
    if isinstance(last, list) and len(last) == len(s.optimizer.param_groups):
        # get_last_lr() should report what the optimizer now uses.
        s._last_lr = [_num(g["lr"]) for g in s.optimizer.param_groups]
    return {"class": type(s).__name__, "changed": changed, "notes": notes}
