"""TensorCensus: the live tensors of this process grouped by device, dtype and shape, on request.

What gets captured
------------------
Every tensor the garbage collector tracks (``gc.get_objects()``), grouped by (device, dtype,
shape, kind): count and bytes (each tensor's own elements: a view counts its own size). The
kind is ``parameter``, ``gradient`` or ``optimizer`` for the root model's and the optimizers'
parameters, their ``.grad`` and the optimizers' state, else ``other``; a group names a holder
where one is cheap to find: a parameter's qualified name, ``Optimizer.state[name].key``, a
global of ``__main__`` (a tensor, or a list/tuple/dict of them: ``leaked[17]``), or a local of
the training thread's frames (``main() leaked[17]``). The census remembers each group's count,
so the next one says how it changed (``count_change``): a list gaining a tensor per step
shows as a group whose count grows between two calls.

Cost: one pass over the GC's objects under the GIL (~50 ms per million objects on these VMs),
on the serving pool, only when asked (``GET /v1/memory/tensors``); training waits that long.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from ..heapscan import live_objects
from ..thread_frames import current_frames

#: Containers looked into for holders, per global or local (a list of 10k tensors is named by
#: its first entries).
_SCAN_ITEMS = 10_000


class TensorCensus:
    """Args:
        stepclock: the step the census was taken at, and the training thread whose locals are
            looked at for holders.
        tracer: the root model (parameter names) and the optimizers seen (their state); may be
            None.
    """

    def __init__(self, stepclock: Any, tracer: Any) -> None:
        self.stepclock = stepclock
        self.tracer = tracer
        self._prev: dict[tuple[str, str, str, str], int] = {}
        self._prev_step: int | None = None
        self._lock = threading.Lock()

    def take(self, top: int, models: list[Any] | None = None) -> dict[str, Any]:
        """The census; ``models``: the job's models (discovery), for parameter names when the
        tracer has seen no root model (tracing off)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return {"groups": [], "tensors": 0, "total_mib": 0.0, "step": None,
                    "note": "torch is not imported in this process"}
        with self._lock:  # two censuses at once would both read and write _prev
            return self._take(torch, top, models or [])

    def _take(self, torch: Any, top: int, models: list[Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        tensor, module = torch.Tensor, torch.nn.Module
        live = live_objects({"tensors": (tensor,), "modules": (module,)})
        found, mods = live["tensors"], live["modules"]
        del live
        labels = self._labels(torch, [*models, *_roots(mods)])
        del mods
        holders = _holders(torch, self.stepclock.training_thread)
        groups: dict[tuple[str, str, str, str], list[Any]] = {}
        n = skipped = 0
        fake = getattr(getattr(getattr(torch, "_subclasses", None), "fake_tensor", None),
                       "FakeTensor", None)  # already imported when torch.compile ran
        for o in found:
            kind, holder = labels.get(id(o), ("other", None))
            if type(o) is not tensor and fake is not None and isinstance(o, fake):
                skipped += 1  # torch.compile's fake tensors: no storage, symbolic shapes
                continue
            try:
                key = (str(o.device), str(o.dtype).removeprefix("torch."), str(tuple(o.shape)),
                       kind)
                size = o.numel() * o.element_size()
            except Exception:  # noqa: BLE001 - any subclass may raise anything from a size
                skipped += 1  # (a symbolic shape raised AssertionError): the census goes on
                continue
            n += 1
            g = groups.get(key)
            if g is None:
                g = groups[key] = [0, 0, None]
            g[0] += 1
            g[1] += size
            if g[2] is None:
                g[2] = holder or holders.get(id(o))
        step = self.stepclock.current_step if self.stepclock.seen_step else None
        rows = []
        for key, (count, size, holder) in groups.items():
            prev = self._prev.get(key)
            rows.append({"device": key[0], "dtype": key[1], "shape": key[2], "count": count,
                         "mib": round(size / 2**20, 3), "kind": key[3], "holder": holder,
                         "count_change": None if self._prev_step is None
                         else count - (prev or 0)})
        rows.sort(key=lambda r: -r["mib"])
        body = {"step": step, "previous_step": self._prev_step, "tensors": n, "skipped": skipped,
                "total_mib": round(sum(r["mib"] for r in rows), 3), "groups": rows[:top],
                "census_ms": round(1e3 * (time.perf_counter() - t0), 1)}
        self._prev = {(r["device"], r["dtype"], r["shape"], r["kind"]): r["count"] for r in rows}
        self._prev_step = step if step is not None else -1
        return body

    def _labels(self, torch: Any, models: list[Any]) -> dict[int, tuple[str, str]]:
        """id(tensor) -> (kind, holder) for parameters, gradients and optimizer state."""
        out: dict[int, tuple[str, str]] = {}
        names: dict[int, str] = {}
        root = getattr(self.tracer, "root", None) if self.tracer is not None else None
        for model in [root, *models]:
            if model is None or not hasattr(model, "named_parameters"):
                continue
            for name, p in model.named_parameters():
                if id(p) in names:
                    continue
                names[id(p)] = name
                out[id(p)] = ("parameter", name)
                if isinstance(p.grad, torch.Tensor):
                    out[id(p.grad)] = ("gradient", f"{name}.grad")
        for opt in self.stepclock.optimizers():
            cls = type(opt).__name__
            for group in opt.param_groups:
                for p in group["params"]:
                    label = names.get(id(p), f"param_groups[{len(names)}]")
                    out.setdefault(id(p), ("parameter", label))
                    if isinstance(p.grad, torch.Tensor):
                        out.setdefault(id(p.grad), ("gradient", f"{label}.grad"))
            for p, state in opt.state.items():
                if not isinstance(state, dict):
                    continue
                label = names.get(id(p), "?")
                for k, v in state.items():
                    if isinstance(v, torch.Tensor):
                        out[id(v)] = ("optimizer", f"{cls}.state[{label}].{k}")
        return out


def _roots(mods: list[Any]) -> list[Any]:
    """The modules no other live module holds as a child (the models), largest first."""
    children = {id(c) for m in mods for c in getattr(m, "_modules", {}).values()}
    roots = [m for m in mods if id(m) not in children]
    return sorted(roots, key=lambda m: -len(getattr(m, "_modules", {})))


def _holders(torch: Any, training_thread: int | None) -> dict[int, str]:
    """id(tensor) -> where it is held: a global of ``__main__``, a local of the training
    thread's frames (innermost first) or a global of their modules, directly or in a
    list/tuple/dict. Frames of installed packages and the standard library are skipped."""
    out: dict[int, str] = {}
    skip = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    scopes: list[tuple[str, dict[str, Any]]] = []
    seen_globals: set[int] = set()
    main = sys.modules.get("__main__")
    if main is not None:
        scopes.append(("", dict(vars(main))))
        seen_globals.add(id(vars(main)))
    frame = current_frames().get(training_thread or threading.main_thread().ident or 0)
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(skip) and "/probe_agent/" not in code.co_filename:
            scopes.append((f"{code.co_name}() ", dict(frame.f_locals)))
            if id(frame.f_globals) not in seen_globals:
                seen_globals.add(id(frame.f_globals))
                mod = str(frame.f_globals.get("__name__", "?")).rsplit(".", 1)[-1]
                scopes.append((f"{mod}.", dict(frame.f_globals)))
        frame = frame.f_back
    tensor = torch.Tensor
    for prefix, names in scopes:
        for name, v in names.items():
            if isinstance(v, tensor):
                out.setdefault(id(v), f"{prefix}{name}")
            elif isinstance(v, (list, tuple)):
                for i, x in enumerate(v[:_SCAN_ITEMS]):
                    if isinstance(x, tensor):
                        out.setdefault(id(x), f"{prefix}{name}[{i}]")
            elif isinstance(v, dict) and not name.startswith("__"):
                for i, (k, x) in enumerate(v.items()):
                    if i >= _SCAN_ITEMS:
                        break
                    if isinstance(x, tensor):
                        out.setdefault(id(x), f"{prefix}{name}[{k!r}]")
    return out
