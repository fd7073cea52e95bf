"""Wrappers that stand between a user and their model, optimizer and scheduler, taken off.

Frameworks hand the training loop wrapped objects; actions must change and save the objects
that really step, and names must be those of the user's model:

=================================  ====================================  =======================
wrapper                            what it holds                         taken off by
=================================  ====================================  =======================
DistributedDataParallel,           ``.module``                           ``model``
DataParallel
FSDP1 FullyShardedDataParallel     ``.module`` (= ``_fsdp_wrapped_       ``model`` unless
                                   module``)                             ``keep_fsdp``
FSDP2 ``fully_shard``              nothing: it swaps the class in place  (nothing to take off)
                                   (``FSDP<Name>``) and makes the
                                   parameters DTensors
DeepSpeedEngine                    ``.module``, ``.optimizer``           ``model``
torch.compile OptimizedModule      ``._orig_mod``                        ``model``
Lightning's DDP module wrapper     ``.module`` (the LightningModule)     ``model``
Accelerate AcceleratedOptimizer,   ``.optimizer``                        ``optimizer``
DeepSpeed ZeRO optimizers
Lightning LightningOptimizer       ``._optimizer``                       ``optimizer``
Accelerate AcceleratedScheduler,   ``.scheduler``                        ``scheduler``
Lightning LRSchedulerConfig,
Accelerate DeepSpeedSchedulerWrapper
=================================  ====================================  =======================

Wrappers are recognised by class name and attribute, so nothing here imports a framework.
``clean_module_name`` drops the path parts that wrappers add inside a model
(``_fsdp_wrapped_module.``, ``_checkpoint_wrapped_module.``, ``_orig_mod.``).
"""

from __future__ import annotations

import sys
from typing import Any

#: Module wrappers whose ``.module`` is the wrapped model.
_MODULE_WRAPPERS = frozenset({
    "DistributedDataParallel", "DataParallel", "DeepSpeedEngine", "PipelineEngine",
    "_LightningModuleWrapperBase", "_LightningPrecisionModuleWrapperBase",
    "_FabricModule",
})
_FSDP1 = "FullyShardedDataParallel"
#: Attribute-path parts that wrappers insert into qualified module names.
WRAPPER_NAME_PARTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


def model(module: Any, keep_fsdp: bool = False) -> tuple[Any, str]:
    """The user's module inside ``module``, and the attribute path taken (``".module"``).

    Args:
        keep_fsdp: stop at an FSDP1 wrapper: its sharded state_dict needs the wrapper.
    """
    path = ""
    for _ in range(8):
        attrs = getattr(module, "__dict__", {})
        cls = type(module).__name__
        inner, attr = None, ""
        if "_orig_mod" in getattr(module, "_modules", {}):  # torch.compile's OptimizedModule
            inner, attr = module._modules["_orig_mod"], "._orig_mod"
        elif cls in _MODULE_WRAPPERS or (cls == _FSDP1 and not keep_fsdp):
            inner, attr = getattr(module, "module", None), ".module"
        elif "_forward_module" in attrs and cls == "_FabricModule":
            inner, attr = attrs["_forward_module"], "._forward_module"
        if inner is None or inner is module:
            break
        module, path = inner, path + attr
    return module, path


def optimizer(opt: Any) -> Any:
    """The torch optimizer that really steps behind ``opt`` (``opt`` itself when unwrapped)."""
    for _ in range(4):
        attrs = getattr(opt, "__dict__", {})
        inner = attrs.get("optimizer", attrs.get("_optimizer"))
        if inner is None or inner is opt or not hasattr(inner, "param_groups"):
            break
        opt = inner
    return opt


def scheduler(sched: Any) -> Any:
    """The LR scheduler behind an AcceleratedScheduler or a Lightning LRSchedulerConfig."""
    kinds = scheduler_types()
    for _ in range(4):
        if isinstance(sched, kinds):
            break
        inner = getattr(sched, "__dict__", {}).get("scheduler")
        if inner is None or inner is sched:
            break
        sched = inner
    return sched


def scheduler_types() -> tuple[type, ...]:
    """torch's LR scheduler base classes, and DeepSpeed's own schedulers (plain classes, not
    ``LRScheduler``s) once the program imported them; empty before it imported torch.optim."""
    found: list[type] = []
    for mod, names in (("torch.optim.lr_scheduler", ("LRScheduler", "_LRScheduler",
                                                      "ReduceLROnPlateau")),
                       ("deepspeed.runtime.lr_schedules", _DEEPSPEED_SCHEDULERS)):
        ls = sys.modules.get(mod)
        if ls is not None:
            found += [k for k in (getattr(ls, n, None) for n in names) if isinstance(k, type)]
    return tuple(found)


#: deepspeed.runtime.lr_schedules classes (WarmupDecayLR subclasses WarmupLR).
_DEEPSPEED_SCHEDULERS = ("WarmupLR", "WarmupCosineLR", "OneCycle", "LRRangeTest")


def clean_module_name(name: str) -> str:
    """``_fsdp_wrapped_module.layers.0._checkpoint_wrapped_module.attn`` -> ``layers.0.attn``."""
    parts = [p for p in name.split(".") if p not in WRAPPER_NAME_PARTS]
    return ".".join(parts)
