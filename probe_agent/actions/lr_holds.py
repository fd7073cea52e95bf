"""Does an LR change survive the scheduler's next step? Asked before saying it does.

`probe lr` used to report success under the HF Trainer while the job's scheduler put the LR
back on the next step. Now every scheduler's next step is simulated twice, before and after the
change, on a shallow copy of the scheduler whose optimizer is a stand-in holding copies of the
param groups (the real optimizer, parameters and scheduler are untouched):

- **holds**: the next LR is ``f`` times what it would have been, for every group;
- **partly**: it moved, but not by ``f`` (``eta_min`` left unscaled when groups got different
  factors): applied, and the report says by how much;
- **undone**: the next LR is what it would have been without the change (a scheduler that
  computes absolute LRs from something probe cannot scale): everything is put back as it was and
  the change is refused, with the reason.

LambdaLR always holds: it computes ``base_lr * lambda(step)``, and ``base_lrs`` are scaled, so
even a lambda that returns absolute values (used with ``lr=1.0``) is scaled. Not simulated:
ReduceLROnPlateau (its step needs the metric; it only ever multiplies the current LR, which
is changed) and containers (SequentialLR, ChainedScheduler: what they hold is simulated), and a
scheduler whose simulated step raised (OneCycleLR past its last step): reported as unchecked.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

#: Param-group keys holding LRs (``lr`` and what schedulers read it from).
LR_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")
_REL_TOL = 1e-6


def _num(v: Any) -> float:
    return float(v.item()) if hasattr(v, "item") else float(v)


class _StandIn:
    """An optimizer as a scheduler's step sees it: only ``param_groups`` (copies)."""

    def __init__(self, groups: list[dict[str, Any]]) -> None:
        self.param_groups = groups


def predict_next(s: Any) -> list[float] | None:
    """The LRs ``s.step()`` would set now, or None when it cannot be simulated."""
    if hasattr(s, "_schedulers") or not hasattr(s, "get_lr") or not hasattr(s, "optimizer"):
        return None
    if type(s).__name__ == "ReduceLROnPlateau":
        return None
    groups = []
    for g in s.optimizer.param_groups:
        c = {k: v for k, v in g.items() if k != "params"}
        for k in LR_KEYS:
            if k in c and hasattr(c[k], "item"):
                c[k] = _num(c[k])  # a float copy: the scheduler would fill_ a tensor in place
        c["params"] = []
        groups.append(c)
    twin = copy.copy(s)
    twin.optimizer = _StandIn(groups)
    twin._step_count = max(int(getattr(s, "_step_count", 0) or 0), 2)  # no first-step warnings
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            twin.step()
    except Exception:  # the job's own scheduler code may raise anything; then it is unchecked
        return None
    return [_num(g["lr"]) for g in groups]


def snapshot(optimizers: list[Any], schedulers: list[Any]) -> list[Any]:
    """What ``restore`` needs to undo a change: LR values of every group, scheduler dicts."""
    groups = [(g, {k: (g[k].clone() if hasattr(g[k], "clone") else g[k])
                   for k in LR_KEYS if k in g})
              for o in optimizers for g in o.param_groups]
    scheds = [(s, dict(vars(s))) for s in schedulers if hasattr(s, "__dict__")]
    return [groups, scheds]


def restore(saved: list[Any]) -> None:
    groups, scheds = saved
    for g, values in groups:
        for k, v in values.items():
            if hasattr(g[k], "copy_") and hasattr(v, "copy_"):
                g[k].copy_(v)
            else:
                g[k] = v
    for s, attrs in scheds:
        vars(s).update(attrs)


def judge(before: list[float] | None, after: list[float] | None,
          factors: list[float]) -> tuple[str, str]:
    """``(verdict, line)``: ``holds``, ``partly``, ``undone`` or ``unchecked``."""
    if before is None or after is None or len({len(before), len(after), len(factors)}) != 1:
        return "unchecked", "its next step could not be simulated"
    want = [b * f for b, f in zip(before, factors)]
    if all(math.isclose(a, w, rel_tol=_REL_TOL, abs_tol=1e-30) for a, w in zip(after, want)):
        shown = ", ".join(f"{a:.6g}" for a in after)
        return "holds", f"checked: its next step sets {shown}"
    if all(math.isclose(a, b, rel_tol=_REL_TOL, abs_tol=1e-30) for a, b in zip(after, before)
           ) and any(not math.isclose(f, 1.0) for f in factors):
        shown = ", ".join(f"{b:.6g}" for b in before)
        return "undone", f"its next step would set the LR back to {shown}"
    got = ", ".join(f"{a:.6g}" for a in after)
    exp = ", ".join(f"{w:.6g}" for w in want)
    return "partly", f"its next step sets {got}, not {exp}"


def watch_next_step(clock: Any, action: Any, optimizers: list[Any]) -> None:
    """With no scheduler to simulate, only the next step tells whether the change holds: a
    loop that sets the LR itself every iteration (nanoGPT's ``get_lr``) puts its own value back
    before that step runs. At the next counted step (training thread, once) the groups' LRs are
    compared with what was set, and ``action.data["next_step"]`` says so; `probe lr` waits for
    it. ``data`` is replaced, never mutated: the serving threads read it meanwhile."""
    import weakref

    refs = [weakref.ref(o) for o in optimizers]
    expected = [[_num(g["lr"]) for g in o.param_groups] for o in optimizers]
    done: list[Any] = []

    def check(step: int, _optimizer: Any) -> None:
        done[0]()  # once: unsubscribe first, so a failure below cannot repeat every step
        now = [[_num(g["lr"]) for g in o.param_groups] if o is not None else []
               for o in (r() for r in refs)]
        held = all(len(e) == len(n) and all(math.isclose(a, b, rel_tol=_REL_TOL, abs_tol=1e-30)
                                            for a, b in zip(e, n))
                   for e, n in zip(expected, now))
        action.data = {**(action.data or {}), "next_step": {
            "step": step, "held": held, "lrs": [x for n in now for x in n]}}

    done.append(clock.subscribe(check, "lr: does the change hold at the next step"))
