"""The process's ``nn.Module`` trees, found on the heap, with qualified names.

For collectors that need the model without being told where it is (the compile state, the MoE
routers): one heap walk (heapscan.py: 50-100 ms on a large job, other threads wait), so callers
do it rarely (the first step, then steps 10, 100, ...). Names are the plain model's
(``layers.3.mlp``): the components that wrappers insert (``_orig_mod`` of torch.compile,
``module`` of DDP and DeepSpeed, FSDP's and checkpoint-wrapper's) are dropped, as the tracer's
names drop them (tracer/trace_names.py).
"""

from __future__ import annotations

from typing import Any

from ..heapscan import live_objects

#: Name components that wrappers insert (tracer/trace_names.py drops the same ones).
WRAPPER_PARTS = frozenset({"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"})
#: Wrapper classes whose one child, ``module``, is the real model.
WRAPPER_CLASSES = frozenset({"DistributedDataParallel", "DataParallel", "DeepSpeedEngine",
                             "PipelineEngine", "OptimizedModule"})


class ModelScan:
    """Every live module and its parent; ``name(m)`` is its qualified name in its model."""

    def __init__(self, torch: Any) -> None:
        self.modules: list[Any] = live_objects({"m": (torch.nn.Module,)})["m"]
        self._parent: dict[int, tuple[Any, str]] = {}
        for m in self.modules:
            for child_name, child in m._modules.items():
                if child is not None:
                    self._parent.setdefault(id(child), (m, child_name))

    def parent(self, module: Any) -> Any:
        got = self._parent.get(id(module))
        return got[0] if got else None

    def name(self, module: Any) -> str:
        """``layers.3.mlp``; a root (no parent) is named by its class."""
        parts: list[str] = []
        m = module
        seen = 0
        while seen < 1000:
            seen += 1
            got = self._parent.get(id(m))
            if got is None:
                break
            up, part = got
            if part not in WRAPPER_PARTS and not (
                    part == "module" and type(up).__name__ in WRAPPER_CLASSES):
                parts.append(part)
            m = up
        return ".".join(reversed(parts)) or type(module).__name__

    def is_root(self, module: Any) -> bool:
        """No parent, or only wrappers above it (DDP around a compiled model)."""
        m = module
        while True:
            got = self._parent.get(id(m))
            if got is None:
                return True
            if type(got[0]).__name__ not in WRAPPER_CLASSES:
                return False
            m = got[0]
