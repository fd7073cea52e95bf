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
=========================================  ==================================================

Every group's ``initial_lr`` (set by any scheduler) is scaled too, so a scheduler created later
with ``last_epoch`` starts from the changed LR. A scalar ``eta_min`` is scaled only when every
group got the same factor (always with ``--scale``); otherwise it is left and the result says so.
A tensor LR (``capturable``/fused optimizers) is updated in place.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

#: Scheduler attributes holding one LR per param group.
_LIST_ATTRS = ("base_lrs", "max_lrs", "min_lrs")
#: How far below the parameters' dtype limit an LR must stay: the largest factor torch.optim
#: applies to the LR before using it (Adam/AdamW's bias correction, 1 / (1 - beta1) at most).
_LR_HEADROOM = 1000.0
#: Param-group keys that schedulers read LRs from.
_GROUP_KEYS = ("initial_lr", "max_lr", "min_lr")


def _num(v: Any) -> float:
    return float(v.item()) if hasattr(v, "item") else float(v)


def _set_group(group: dict[str, Any], key: str, value: float) -> None:
    cur = group[key]
    if hasattr(cur, "fill_"):
        cur.fill_(value)  # a tensor LR: keep the tensor (fused/capturable steps hold it)
    else:
        group[key] = value


def change_lr(
    optimizers: list[Any], schedulers: list[Any], *, scale: float | None = None,
    set_to: float | None = None,
) -> dict[str, Any]:
    """Scale or set every LR; returns what changed (JSON-safe) for the per-rank report."""
    if (scale is None) == (set_to is None):
        raise ValueError("give exactly one of scale or set")
    _check_applicable(optimizers, scale, set_to)
    report: dict[str, Any] = {"optimizers": [], "schedulers": []}
    factors: dict[int, list[float]] = {}  # id(optimizer) -> factor per group
    for i, opt in enumerate(optimizers):
        groups, fs = [], []
        for g in opt.param_groups:
            before = _num(g["lr"])
            if set_to is None:
                f = float(scale or 1.0)
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
    for s in schedulers:
        found = factors.get(id(getattr(s, "optimizer", None)))
        if found is not None:
            report["schedulers"].append(_rescale_scheduler(s, found))
    return report


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
    """Refuse, before changing anything, an LR that would crash or poison the training loop."""
    for value, name in ((scale, "scale"), (set_to, "set")):
        if value is not None and (not math.isfinite(value) or value < 0 or
                                  (name == "scale" and value == 0)):
            raise ValueError(f"lr {name}={value!r} refused: give a finite number"
                             + (" > 0" if name == "scale" else " >= 0"))
    for opt in optimizers:
        for g in opt.param_groups:
            after = set_to if set_to is not None else _num(g["lr"]) * float(scale)
            limit = _largest_lr(g)
            if not after <= limit:
                raise ValueError(
                    f"lr {after:.6g} refused for {type(opt).__name__}: above {limit:.6g}, the "
                    "largest LR its step can apply in its parameters' dtype (optimizer.step() "
                    "would overflow); nothing was changed; give an LR below that limit"
                )


def _rescale_scheduler(s: Any, fs: list[float]) -> dict[str, Any]:
    changed, notes = [], []
    for attr in _LIST_ATTRS:
        values = getattr(s, attr, None)
        if isinstance(values, list) and len(values) == len(fs):
            setattr(s, attr, [v * f if isinstance(v, numbers.Real) else v
                              for v, f in zip(values, fs)])
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
