"""What an adapter gets (``Context``) and what discovery returns (``Discovered``).

A ``Context`` is built once per ``discover()`` call: the training script's names, every
frame's locals on the training thread (framework loops keep their trainer as ``self``), the
optimizers the step clock saw stepping, and the live objects of the types discovery cares
about, from one ``gc`` scan that discovery caches between calls (discovery.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import unwrap


@dataclass(slots=True)
class Discovered:
    """The job's training objects, unwrapped to what really steps.

    Attributes:
        framework: ``"hf_trainer"``, ``"lightning"``, ``"deepspeed"``, ``"accelerate"`` or
            ``"plain"``.
        trainer: the framework's trainer (``transformers.Trainer``, ``lightning.Trainer``,
            ``accelerate.Accelerator``), or the script's own ``trainer`` object, or None.
        models: ``[(name, module)]``, the user's model roots (unwrapped: DDP, compile,
            DeepSpeed, Lightning's wrapper; FSDP2 modules are the user's classes already).
            ``name`` says how to reach it (``trainer.model``, ``model``).
        optimizers: the torch optimizers that step (Accelerate's and Lightning's wrappers
            taken off), primary first.
        schedulers: the LR schedulers of those optimizers (Accelerate's wrapper taken off),
            containers (SequentialLR) after what they hold.
        train_loader: the DataLoader the training loop iterates, or None.
        notes: what discovery could not settle, one line each.
        where: ``id(obj) -> how to reach it`` for the objects above (``trainer.optimizer``,
            ``trainer.optimizers[1]``, ``opt_g``, ``<found by gc>``): for messages.
        wrapped_models: ``[(name, module)]`` as the job holds them (an FSDP1 wrapper kept:
            its sharded state_dict needs it); same order as ``models``.
        models_fixed: the adapter's models are the job's even though they do not own the
            optimizers' parameters (DeepSpeed ZeRO: the optimizer holds flat partitions).
    """

    framework: str
    trainer: Any = None
    models: list[tuple[str, Any]] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    train_loader: Any = None
    notes: list[str] = field(default_factory=list)
    where: dict[int, str] = field(default_factory=dict)
    wrapped_models: list[tuple[str, Any]] = field(default_factory=list)
    models_fixed: bool = False

    def name_of(self, obj: Any) -> str:
        return self.where.get(id(obj), type(obj).__name__)

    # Each adapter reads the same three kinds of objects off its trainer; these take the
    # wrapper off and record where the unwrapped object was found, in one way for all.
    def add_optimizer(self, opt: Any, where: str, inner_suffix: str = "") -> None:
        """``opt`` unwrapped; ``where + inner_suffix`` names it when a wrapper came off."""
        inner = unwrap.optimizer(opt)
        self.optimizers.append(inner)
        self.where[id(inner)] = where + (inner_suffix if inner is not opt else "")

    def add_scheduler(self, sched: Any, where: str, inner_suffix: str = "") -> None:
        inner = unwrap.scheduler(sched)
        self.schedulers.append(inner)
        self.where[id(inner)] = where + (inner_suffix if inner is not sched else "")

    def add_model(self, model: Any, where: str) -> None:
        """The user's module under ``model``, and ``model`` as held (an FSDP1 wrapper kept)."""
        inner, path = unwrap.model(model)
        kept, kpath = unwrap.model(model, keep_fsdp=True)
        self.models.append((where + path, inner))
        self.wrapped_models.append((where + kpath, kept))

    def add_loader(self, loader: Any, where: str) -> None:
        self.train_loader = loader
        self.where[id(loader)] = where


@dataclass(slots=True)
class Context:
    """What adapters look at. ``live(kind)`` lists gc-found objects of one kind
    (``"optimizer"``, ``"scheduler"``, ``"loader"``, ``"trainer"``) without a new scan."""

    namespace: dict[str, Any]
    frame_locals: list[dict[str, Any]]
    stepping: list[Any]
    live: Callable[[str], list[Any]]

    def values(self) -> Iterator[tuple[str, Any]]:
        """Script names first, then the locals of every frame, innermost first (a framework's
        loop keeps its trainer as ``self``)."""
        yield from self.namespace.items()
        for loc in self.frame_locals:
            yield from loc.items()

    def instances(self, cls: type) -> list[tuple[str, Any]]:
        """``[(where, obj)]`` of ``cls`` among the script's names and frame locals, then gc."""
        out: list[tuple[str, Any]] = []
        seen: set[int] = set()
        for name, value in self.values():
            if id(value) not in seen and issubclass(type(value), cls):
                seen.add(id(value))
                out.append((name, value))
        for value in self.live("trainer"):
            if id(value) not in seen and issubclass(type(value), cls):
                seen.add(id(value))
                out.append((f"<{type(value).__name__} found by gc>", value))
        return out

    def trainer(self, qualified: tuple[str, ...], optimizers: Callable[[Any], Any],
                default_label: str) -> tuple[str, Any] | None:
        """``(label, obj)``: the live instance of the loaded classes ``qualified`` whose
        ``optimizers(obj)`` (wrapped or not) steps, else the first found; None if none is
        alive. The label is how the script names it, else ``default_label``."""
        from . import unwrap

        classes = [c for c in (loaded_class(q) for q in qualified) if c is not None]
        found = [f for cls in classes for f in self.instances(cls)]
        if not found:
            return None
        stepping = {id(o) for o in self.stepping}
        where, obj = next(((w, t) for w, t in found
                           if any(id(unwrap.optimizer(o)) in stepping
                                  for o in optimizers(t) or ())), found[0])
        return (where if where in self.namespace else default_label), obj


def loaded_class(qualified: str) -> type | None:
    """``pkg.mod.Class`` if the program imported ``pkg.mod`` (never imports it)."""
    import sys

    mod_name, _, cls_name = qualified.rpartition(".")
    mod = sys.modules.get(mod_name)
    cls = getattr(mod, cls_name, None) if mod is not None else None
    return cls if isinstance(cls, type) else None
