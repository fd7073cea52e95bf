"""The patch ledger: everything the agent changes in the training process, in one place.

Every attribute of torch, the stdlib or a framework that the agent replaces goes through
``replace`` (and back through ``restore``); every process-wide setting it changes is recorded
with ``setting`` (lasting: a signal handler, the excepthook, faulthandler, atexit and fork
hooks, an import finder) or ``window`` (held for a moment and put back each time: the switch
interval during a heap walk, the collector off around ``sys._current_frames()``). `probe info`
and ``/v1/info`` list what is active (``describe``), so a user can see what probe did to their
process; ``Agent.stop`` restores what is left (``restore_all``) and says what it kept and why.

Why one ledger for the process, not one per agent: what it records is process-wide (a class
attribute, a signal handler), a replacement may outlive the agent that made it (re-injection,
start after stop), and the next agent must recognise it (``ours``). memray's ``SymbolPatcher``
is the model: one table, installed and restored in one place.

One marker: a wrapper the ledger installed carries ``MARK`` (``__probe_patch__``), its ``Patch``.
Restoring is careful: ours goes back only while it is still the attribute's value; a wrapper
someone put over ours since stays (removing it would drop theirs), and the ledger says so.
Stdlib only; cheap enough for the hot paths that install and remove per traced step.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

#: The one marker: the attribute on every wrapper the ledger installed (its ``Patch``).
MARK = "__probe_patch__"
_MISSING = object()  # the owner's own __dict__ had no such attribute: it was inherited
_lock = threading.Lock()


def _name(owner: Any) -> str:
    mod = getattr(owner, "__module__", None)
    name = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", None)
    if isinstance(owner, type) and mod and name:
        return f"{mod}.{name}"
    return str(getattr(owner, "__name__", None) or type(owner).__name__)


@dataclass(eq=False)
class Patch:
    """One replaced attribute. ``state`` is what the wrapper serves now, when that can change
    after it is installed (the newest agent's accounting, for a wrapper kept for the process)."""

    owner: Any
    attribute: str
    wrapper: Any
    original: Any  # the value found (inherited or not): what the wrapper calls
    by: str  # the part of the agent that installed it
    why: str
    restorable: bool = True
    why_kept: str = ""  # when not restorable: why it stays for the life of the process
    own: Any = _MISSING  # what the owner's own __dict__ held
    installed_at: float = field(default_factory=time.time)
    active: bool = True
    state: Any = None

    @property
    def target(self) -> str:
        return f"{_name(self.owner)}.{self.attribute}"

    def in_place(self) -> bool:
        """Whether our wrapper is still the attribute's own value."""
        return vars(self.owner).get(self.attribute, _MISSING) is self.wrapper

    def describe(self) -> dict[str, Any]:
        out = {"target": self.target, "by": self.by, "why": self.why,
               "restorable": self.restorable, "installed_at": round(self.installed_at, 3)}
        if not self.restorable:
            out["why_kept"] = self.why_kept
        if not self.in_place():
            out["note"] = "wrapped again since by someone else: ours stays under theirs"
        return out


@dataclass(eq=False)
class Setting:
    """A process-wide setting the agent changed (``setting``) or changes for a moment now and
    then (``window``: ``uses`` counts them)."""

    name: str
    value: str
    by: str
    why: str
    restorable: bool = True
    why_kept: str = ""
    temporary: bool = False
    uses: int = 0
    active: bool = True

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "value": self.value, "by": self.by,
                               "why": self.why, "restorable": self.restorable}
        if self.temporary:
            out["temporary"] = True
            out["uses"] = self.uses
        if not self.restorable:
            out["why_kept"] = self.why_kept
        return out

    def done(self) -> None:
        """The setting was put back."""
        with _lock:
            self.active = False
            if self in _settings:
                _settings.remove(self)


_patches: list[Patch] = []
_settings: list[Setting] = []


def ours(value: Any) -> Patch | None:
    """The Patch that installed ``value`` when it is one of our wrappers, else None."""
    patch = getattr(value, MARK, None)
    return patch if isinstance(patch, Patch) else None


def replace(owner: Any, attribute: str, wrapper: Any, *, by: str, why: str,
            restorable: bool = True, why_kept: str = "") -> Patch:
    """Set ``owner.attribute`` to ``wrapper`` and record it.

    Args:
        owner: a module or class (its own ``__dict__`` is what ``restore`` puts back).
        wrapper: what replaces it; it gets ``MARK`` (a staticmethod or builtin that cannot
            take attributes is recognised by identity through ``active``).
        by: the part of the agent (``"tracer"``, ``"collectives"``...), shown by `probe info`.
        why: one line, what the replacement is for.
        restorable: False for one kept for the life of the process; ``why_kept`` says why.
    """
    patch = Patch(owner, attribute, wrapper, getattr(owner, attribute, None), by, why,
                  restorable, why_kept, vars(owner).get(attribute, _MISSING))
    try:
        setattr(wrapper, MARK, patch)
    except (AttributeError, TypeError):
        pass
    with _lock:
        setattr(owner, attribute, wrapper)
        _patches.append(patch)
    return patch


def restore(patch: Patch | None) -> bool:
    """Put ``patch``'s owner back as it was, if ours is still in place; True when restored.
    Someone's wrapper over ours stays, and so does ours under it (listed still: it is in the
    process, and passes through once its part has stopped); a later call restores it if theirs
    is gone by then. Idempotent."""
    if patch is None:
        return False
    with _lock:
        if not patch.active or not patch.in_place():
            return False
        if patch.own is _MISSING:
            delattr(patch.owner, patch.attribute)  # back to the inherited one
        else:
            setattr(patch.owner, patch.attribute, patch.own)
        patch.active = False
        _patches.remove(patch)
        return True


def forget(patch: Patch | None) -> None:
    """Stop listing ``patch`` without touching its owner (its part put it back itself)."""
    with _lock:
        if patch is not None and patch in _patches:
            patch.active = False
            _patches.remove(patch)


def setting(name: str, value: str, *, by: str, why: str, restorable: bool = True,
            why_kept: str = "") -> Setting:
    """Record a lasting process-wide change; call ``done()`` on the result when it is undone."""
    s = Setting(name, value, by, why, restorable, why_kept)
    with _lock:
        _settings.append(s)
    return s


def window(name: str, value: str, *, by: str, why: str) -> Setting:
    """Record a setting held for a moment and put back each time (``uses += 1`` per use)."""
    with _lock:
        for s in _settings:
            if s.temporary and s.name == name and s.by == by:
                return s
        s = Setting(name, value, by, why, temporary=True)
        _settings.append(s)
    return s


def active() -> list[Patch]:
    with _lock:
        return list(_patches)


def settings() -> list[Setting]:
    with _lock:
        return list(_settings)


def describe() -> dict[str, Any]:
    """What `probe info` and ``/v1/info`` show: ``patches`` and ``settings`` now active."""
    return {"patches": [p.describe() for p in active()],
            "settings": [s.describe() for s in settings()]}


def restore_all() -> dict[str, Any]:
    """Restore every restorable patch still active (each part restores its own when it stops;
    this catches what one left behind) and say what stays: ``restored`` (targets),
    ``kept`` ({target, why}: not restorable, or wrapped again since by someone else)."""
    restored, kept = [], []
    for p in active():
        if p.restorable:
            if restore(p):
                restored.append(p.target)
            else:
                kept.append({"target": p.target,
                             "why": "wrapped again since by someone else: theirs stays"})
        else:
            kept.append({"target": p.target, "why": p.why_kept})
    for s in settings():
        if not s.restorable:
            kept.append({"target": s.name, "why": s.why_kept})
    return {"restored": restored, "kept": kept}
