"""UnusedParams: the parameters that got no gradient, per rank and step -> ``python.unused_params``.

DDP all-reduces gradients bucket by bucket as they become ready; a parameter the loss never
reached is never ready, so without ``find_unused_parameters=True`` the reduction never finishes
and the next iteration fails with "Expected to have finished reduction in the prior iteration"
(torch names parameter indices, not modules). With it, DDP walks the autograd graph after every
forward to find them: a cost on every step, worth paying only when some parameter really goes
unused. So the job needs to know which parameters get no gradient, and whether that ever
happens.

When: right before ``optimizer.step()`` (a global pre hook: the gradients of the step are there;
the HF Trainer and Lightning zero them right after the step), on traced steps (the tracer
records this step) and on the first ``FIRST_STEPS`` steps of a job of more than one rank (where
DDP lives; a crash at step 2 leaves step 1's rows in the post-mortem copy). On any other step
the hook returns after two attribute reads.

What: every parameter of the stepping optimizer that requires grad and has ``grad is None``, by
its qualified name in the job's model (``aux.weight``; a DDP wrapper's ``module.`` prefix taken
off) and its module. A recorded step with no such parameter is one row with ``param`` NULL, so
"always empty" (find_unused_parameters only costs time) can be told from "not recorded". The
model and the names come from the framework layer's discovery (one heap walk, cached), only on
the recorded steps.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from . import Guard, Sink
from .registry import CollectorSpec
from .row_buffer import RowBuffer
from .torch_import import imported

TABLE = "python.unused_params"
#: Steps recorded at the start of a multi-rank job, traced or not.
FIRST_STEPS = 5
#: Parameters named per recorded step (a model that leaves a whole tower unused says so in its
#: first rows; the rest would only repeat it).
MAX_PER_STEP = 64


class UnusedParams:
    """Collector for ``python.unused_params``. ``tracer``: its ``recording`` says the step is
    traced (None: only the first steps are recorded)."""

    def __init__(self, clock: Any, rank: int, tracer: Any) -> None:
        self.clock = clock
        self.rank = rank
        self.tracer = tracer
        self.guard = Guard("unused parameters")
        self.rows = RowBuffer(TABLE)  # python.unused_params rows, flushed by the writer
        self._hook: Any = None
        self._left = FIRST_STEPS
        self._names: dict[int, str] = {}
        self._names_key: tuple[int, ...] = ()
        self._find_unused: bool | None = None
        self._flag_read = False  # DDP's find_unused_parameters looked up (once)
        self._stopped = False

    def start(self, sink: Sink) -> None:
        self.rows.start(sink)
        sink.add_flusher(self.flush)
        self.tick()

    def stop(self) -> None:
        self._stopped = True
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def tick(self) -> None:
        """Install the pre-step hook once ``torch.optim`` is imported (never importing it)."""
        if self._hook is not None or self._stopped:
            return
        optim = imported("torch.optim.optimizer")
        if optim is None:
            return
        from .. import optim_hooks

        self._hook = optim_hooks.register(optim, "pre", self._pre_step)

    # -- training thread ---------------------------------------------------------------------
    def _pre_step(self, optimizer: Any, *_: Any) -> None:
        traced = bool(getattr(self.tracer, "recording", False))
        if not traced and self._left <= 0:
            return
        if not self.guard.enabled:
            return
        try:
            if not traced:
                if not _multi_rank():
                    self._left = 0  # a single process: no DDP, nothing to record untraced
                    return
                self._left -= 1
            self._record(optimizer)
        except Exception as e:  # noqa: BLE001 - training thread: counted, never raised
            self.guard.failed(e)

    def _record(self, optimizer: Any) -> None:
        params = [p for g in getattr(optimizer, "param_groups", ()) for p in g.get("params", ())]
        unused = [p for p in params if getattr(p, "requires_grad", False) and p.grad is None]
        names = self._param_names(params) if unused or not self._flag_read else {}
        step = int(getattr(self.clock, "current_step", 0) or 0) + 1
        now = time.time()
        if not unused:
            self.rows.add((now, self.rank, step, None, None, None, len(params),
                           self._find_unused))
            return
        for p in unused[:MAX_PER_STEP]:
            name = names.get(id(p)) or f"<unnamed {tuple(p.shape)}>"
            module = name.rpartition(".")[0] if "." in name else ""
            self.rows.add((now, self.rank, step, name, module, int(p.numel()), len(params),
                           self._find_unused))

    def _param_names(self, params: list[Any]) -> dict[int, str]:
        key = tuple(id(p) for p in params[:8]) + (len(params),)
        if key == self._names_key and self._names:
            return self._names
        from ..frameworks import discover

        d = discover(frame=None, optimizers=None, frame_locals=False)
        names: dict[int, str] = {}
        flags: list[bool] = []
        models = [m for _, m in getattr(d, "models", ()) or ()]
        root = getattr(self.tracer, "root", None)
        if root is not None:
            models.append(root)
        for model in models:
            for n, p in model.named_parameters():
                names.setdefault(id(p), n.removeprefix("module."))
        if not self._flag_read and _multi_rank():
            flags = _ddp_flags(models)
        self._flag_read = True
        if flags:
            self._find_unused = any(flags)
        self._names, self._names_key = names, key
        return names

    # -- writer thread -----------------------------------------------------------------------
    def flush(self) -> None:
        self.tick()
        self.rows.flush()


def _ddp_flags(models: list[Any]) -> list[bool]:
    """``find_unused_parameters`` of the DDP wrappers holding ``models`` (discovery unwraps
    them): one heap walk for DDP objects (heapscan.py), once, at the first recorded step."""
    ddp = getattr(sys.modules.get("torch.nn.parallel"), "DistributedDataParallel", None)
    if ddp is None:
        return []
    from ..heapscan import live_objects

    found = live_objects({"ddp": (ddp,)}).get("ddp", ())
    mine = [w for w in found if any(getattr(w, "module", None) is m or w is m for m in models)]
    return [bool(getattr(w, "find_unused_parameters", False)) for w in mine or found]


def _multi_rank() -> bool:
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_initialized() and dist.get_world_size() > 1)
    except Exception:  # noqa: BLE001 - an odd backend state: treat as one process
        return False


#: This collector, for the registry (registry.py).
COLLECTOR = CollectorSpec(
    "unused_params", 75, needs=("tracer",), tables=(TABLE,),
    build=lambda b: UnusedParams(b.clock, b.rank, b.get("tracer")))
