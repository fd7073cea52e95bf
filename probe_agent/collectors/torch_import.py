"""TorchImportWatcher: run a callback once the program has imported torch (never import it).

The agent may start (PROBE=1, .pth) before the program imports torch; importing torch ourselves
would change import order and cost seconds, so the tracer arms itself right after the
program's own ``import torch`` finishes.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

from .. import patches


class TorchImportWatcher(importlib.abc.MetaPathFinder):
    """Calls ``fire`` right after ``import torch`` finishes, then removes itself.

    The torch loader's ``exec_module`` is wrapped on its instance (not replaced), so
    ``torch.__spec__.loader`` stays the real loader.
    """

    def __init__(self, fire: Any) -> None:
        self.fire = fire
        self._busy = False
        self._record: patches.Setting | None = None

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch" or self._busy:
            return None
        self._busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        finally:
            self._busy = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module
        watcher = self
        patch: list[patches.Patch] = []

        def exec_module(module: Any) -> None:
            try:
                original(module)
            finally:
                patches.restore(patch[0])  # back to the class's method
            watcher.remove()
            watcher.fire()

        patch.append(patches.replace(
            loader, "exec_module", exec_module, by="torch import watcher",
            why="arms the agent's torch wrappers right after `import torch` finishes"))
        return spec

    def install(self) -> None:
        sys.meta_path.insert(0, self)
        self._record = patches.setting(
            "sys.meta_path", "TorchImportWatcher first", by="torch import watcher",
            why="finds the loader of `import torch` (the finders after it still find it)")

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        record, self._record = self._record, None
        if record is not None:
            record.done()


def imported(name: str) -> Any:
    """The module ``name`` once the program has fully imported it, else None (never imports it).

    A module is in ``sys.modules`` from the start of its import: while another thread is still
    executing it (``__spec__._initializing``), its attributes are half there. Every collector that
    waits for part of torch asks this, not ``sys.modules``."""
    mod = sys.modules.get(name)
    if mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False):
        return None
    return mod


def torch_ready() -> bool:
    """True once the program has fully imported torch (never imports it)."""
    torch = imported("torch")
    return torch is not None and "torch.optim.optimizer" in sys.modules and hasattr(
        torch, "compiler")
