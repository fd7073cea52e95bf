"""The seed playbook's names (``optimizer``, ``model``, ``scheduler``/``lr_scheduler``,
``train_loader``, ``trainer``) as discovered objects, for eval code that uses them without the
script defining them (operator_code.CodeRun.execute decides when).

``optimizer`` is the torch optimizer that steps (so ``optimizer.param_groups[0]['lr']`` is the LR
of the next step), ``model`` the user's model (unwrapped), ``scheduler`` the real LR scheduler
(a SequentialLR, not what it holds). A name with two candidates raises a one-line ``NameError``
that lists them by how to reach each; a name with none is left out (Python's own NameError).
"""

from __future__ import annotations

from types import FrameType
from typing import Any

from .discovery import discover


def resolve(names: list[str], frame: FrameType | None = None,
            optimizers: list[Any] | None = None) -> dict[str, Any]:
    try:
        d = discover(frame=frame, optimizers=optimizers)
    except Exception as e:  # a framework object that raised when read: say so, not a bare trace
        raise NameError(f"name {names[0]!r} is not defined by the script, and probe could not "
                        f"discover it: {type(e).__name__}: {e}") from e
    schedulers = [s for s in d.schedulers if not _inside_container(s, d.schedulers)]
    candidates: dict[str, list[Any]] = {
        "optimizer": d.optimizers,
        "model": [m for _, m in d.models],
        "scheduler": schedulers,
        "lr_scheduler": schedulers,
        "train_loader": [d.train_loader] if d.train_loader is not None else [],
        "trainer": [d.trainer] if d.trainer is not None else [],
    }
    model_names = {id(m): n for n, m in d.models}
    out: dict[str, Any] = {}
    for name in names:
        found = candidates.get(name, [])
        if len(found) == 1:
            out[name] = found[0]
        elif len(found) > 1:
            wheres = [model_names.get(id(o)) or d.name_of(o) for o in found]
            listed = ", ".join(f"{w} ({type(o).__name__})" for w, o in zip(wheres, found))
            pick = (f"{name} = {wheres[0]}" if not wheres[0].startswith("<")
                    else f"{name} = <one of them>")
            raise NameError(f"name {name!r} is ambiguous: this job has {len(found)}: {listed}; "
                            f"pick one first, e.g. {pick}")
    return out


def _inside_container(s: Any, schedulers: list[Any]) -> bool:
    return any(s in getattr(c, "_schedulers", ()) for c in schedulers if c is not s)
