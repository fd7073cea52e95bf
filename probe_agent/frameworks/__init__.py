"""The framework layer: find a job's trainer, models, optimizers, schedulers and train loader,
whatever framework runs it, and take the wrappers off.

API (the agent never imports a framework; everything is recognised among modules the program
already imported)::

    from probe_agent.frameworks import discover, unwrap

    d = discover()              # Discovered; cheap enough per request (gc scan cached)
    d.framework                 # "hf_trainer" | "lightning" | "accelerate" | "plain"
    d.trainer                   # transformers.Trainer / lightning.Trainer / Accelerator / None
    d.models                    # [(name, module)]: the user's model roots, unwrapped, e.g.
                                #   [("trainer.model", GPT2LMHeadModel)],
                                #   [("trainer.lightning_module", Regressor)]
    d.optimizers                # torch optimizers that really step, primary first
    d.schedulers                # their LR schedulers (AcceleratedScheduler taken off)
    d.train_loader              # the DataLoader the loop iterates, or None
    d.notes                     # what could not be settled, one line each
    d.name_of(obj)              # how to reach obj: "trainer.optimizer.optimizer", ...
    d.wrapped_models            # as the job holds them (FSDP1 wrapper kept, for saving)

    unwrap.model(m)             # (user's module, ".module._orig_mod"): DDP, FSDP1, DeepSpeed,
                                #   torch.compile, Lightning's wrapper
    unwrap.optimizer(o)         # AcceleratedOptimizer / LightningOptimizer / ZeRO -> torch's
    unwrap.scheduler(s)         # AcceleratedScheduler / LRSchedulerConfig -> torch's
    unwrap.clean_module_name(n) # drops _fsdp_wrapped_module., _checkpoint_wrapped_module., ...

To name modules the way a user reads them (``net.0``, ``transformer.h.3.attn``), qualify them
from the root in ``d.models`` that owns the optimizer's parameters: under Lightning that is the
LightningModule, which is never called itself (its ``self.net`` is).

``discover(frame=None, optimizers=None, fresh=False)``: ``frame`` is the training thread's
innermost frame (default: the main thread's); ``optimizers`` those the step clock saw stepping
(the caller passes ``StepClock.optimizers()``; none: only the script's names and live objects);
``fresh`` rescans live objects (actions do, once per action).

Adding a framework (DeepSpeed's own engine loop, torchtitan) is one module with ``name``,
``trainer_classes`` (qualified class names, for the gc scan) and ``find(ctx) -> Discovered |
None``, listed in ``discovery.ADAPTERS``; ``plain.complete`` fills whatever it leaves out.
Importing this package imports neither torch nor any framework.
"""

from __future__ import annotations

from . import unwrap
from .base import Discovered
from .discovery import discover

__all__ = ["Discovered", "discover", "unwrap"]
