"""What an immediate eval must not do to a running job: reshard FSDP2 parameters under it.

``probe eval`` (without ``--next-step``) runs on its own thread while the training thread goes on.
On FSDP2 (``fully_shard``), ``model.state_dict()`` and ``load_state_dict`` first put every
parameter group back to its sharded form (``FSDPParamGroup._to_sharded``). Mid-step the training
thread holds those groups unsharded; swapping them under it made that rank skip a reduce-scatter,
so its next all_reduce met the other rank's reduce-scatter and the ranks fell out of step for
good (seen in CI: ``torch.save(model.state_dict())`` on rank 0 of a 2-rank FSDP2 job). At a
step boundary the groups are already sharded, the transition is a no-op and nothing is refused.

So a state change of an FSDP2 parameter group asked for from an eval thread raises, with what to
run instead. Only ``probe-agent.eval`` threads are refused; the job's own threads never are.
torch's private class is patched only if it has the methods this was written against (torch
2.4-2.13); without them nothing is guarded, which is the behaviour before this module.
"""

from __future__ import annotations

import threading
from typing import Any

from . import patches
from .collectors.torch_import import imported

#: The evaluator's thread name (evaluator.py); step-boundary actions run on the training thread.
EVAL_THREAD = "probe-agent.eval"
_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
#: Transition -> the property that says it would be a no-op.
_TRANSITIONS = {"_to_sharded": "is_sharded", "_to_unsharded": "is_unsharded",
                "_to_sharded_post_forward": "is_sharded_post_forward"}
MESSAGE = ("probe refused: on FSDP2 this reshards parameters the training thread is using "
           "mid-step, and the ranks' collectives would fall out of step; run it at a step "
           "boundary instead: probe eval --next-step '...' (or probe checkpoint PATH)")


class MidStepReshard(RuntimeError):
    """An immediate eval asked FSDP2 to change a parameter group's sharding mid-step."""


def install() -> bool:
    """Guard FSDP2's parameter groups once the program has imported FSDP2; True when guarded."""
    mod = imported(_MODULE)
    cls = getattr(mod, "FSDPParamGroup", None)
    if cls is None:
        return False
    for name, noop_when in _TRANSITIONS.items():
        original = getattr(cls, name, None)
        if original is None or patches.ours(original) is not None:
            continue
        if not isinstance(getattr(cls, noop_when, None), property):
            continue
        patches.replace(
            cls, name, _guarded(original, noop_when), by="eval guard",
            why="refuses an immediate eval's mid-step FSDP2 reshard", restorable=False,
            why_kept="kept for the process: it passes through on every thread but the agent's "
            "eval thread, and an eval of a later agent (re-injection) needs the same guard")
    return True


def _guarded(original: Any, noop_when: str) -> Any:
    def transition(self: Any) -> Any:
        if threading.current_thread().name == EVAL_THREAD and not getattr(self, noop_when):
            raise MidStepReshard(MESSAGE)
        return original(self)

    transition.__name__ = original.__name__
    transition.__doc__ = original.__doc__
    return transition
