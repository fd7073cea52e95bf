"""PauseMeter: the time a step spent saving checkpoints and evaluating, on the training thread.
LoopMonitor owns it and writes both per step (``python.step_stats.ckpt_wait``/``eval_wait``).

Checkpoint saves
----------------
The save functions are wrapped where programs look them up at call time (module attributes):
``torch.save`` (= ``torch.serialization.save``: DeepSpeed, Lightning and the HF Trainer's
optimizer state go through it), ``torch.distributed.checkpoint.save``/``async_save`` (the
synchronous part: staging) and ``safetensors.torch.save_file``/``save_model``. A function bound
before the agent armed (``from torch import save``) is not seen. Nested saves (DCP calling
torch.save) count once. Saves on other threads (an async checkpointer's) do not pause the step
and are not counted.

Evaluation
----------
The time from a module's outermost ``train(False)`` (``model.eval()``) to its next
``train(True)`` on the training thread, when both fall between two optimizer steps. A model
still in eval mode at the optimizer step trains in eval mode: that interval is dropped, not
counted, so a job that trains with dropout switched off by ``eval()`` has no eval share.
Checkpoint time inside an eval interval counts as checkpoint only.

Cost (bench/bench_schedule_pauses.py): +1-7 µs per save; ``model.train()`` on 123 modules
+9-12 µs (x1.05; the wrapper runs for every child, and the HF Trainer calls it every step).
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

from .. import patches
from .torch_import import imported

#: (module, attribute) of the save functions to time.
SAVES = (("torch", "save"), ("torch.serialization", "save"),
         ("torch.distributed.checkpoint", "save"), ("torch.distributed.checkpoint", "async_save"),
         ("safetensors.torch", "save_file"), ("safetensors.torch", "save_model"))
_MODULE = "torch.nn.modules.module"


class PauseMeter:
    """Per-step checkpoint and eval seconds; ``take()`` at each step boundary."""

    def __init__(self) -> None:
        self.ckpt = 0.0
        self.eval = 0.0
        self.trained_in_eval = 0  # steps taken with an eval() interval still open
        self.thread: int | None = None  # the training thread (set at the first step)
        self._depth = 0
        self._eval_t0: float | None = None
        self._ckpt_in_eval = 0.0
        self._train_depth = 0
        self._saves: dict[tuple[str, str], patches.Patch] = {}
        self._module_cls: Any = None
        self._train_patch: patches.Patch | None = None
        self.stopped = False

    def _mine(self) -> bool:
        t = self.thread
        return (threading.get_ident() == t) if t is not None else (
            threading.current_thread() is threading.main_thread())

    def install(self) -> None:
        """Wrap what the program has imported so far (writer thread tick; cheap when done)."""
        if self.stopped:
            return
        for name, attr in SAVES:
            if (name, attr) in self._saves or (mod := imported(name)) is None:
                continue
            orig = getattr(mod, attr, None)
            if orig is None or patches.ours(orig) is not None:
                continue
            # torch.save and torch.serialization.save are one function: wrap it once
            same = next((p.wrapper for p in self._saves.values() if p.original is orig), None)
            self._saves[(name, attr)] = patches.replace(
                mod, attr, same or self._wrap_save(orig), by="loop monitor",
                why="times checkpoint saves on the training thread (python.step_stats)")
        if self._module_cls is None and (mm := imported(_MODULE)) is not None:
            cls = mm.Module
            orig_train = cls.__dict__["train"]
            meter = self

            # wraps: the same name and module as the original, so pickling by reference and
            # inspect.signature still find what they expect
            @functools.wraps(orig_train)
            def train(module: Any, mode: bool = True) -> Any:
                if meter._train_depth or not meter._mine():
                    return orig_train(module, mode)
                meter._train_depth += 1
                try:
                    meter._switch(module, mode)
                    return orig_train(module, mode)
                finally:
                    meter._train_depth -= 1

            self._module_cls = cls
            self._train_patch = patches.replace(
                cls, "train", train, by="loop monitor",
                why="times eval passes between steps (model.eval() .. model.train())")

    def _wrap_save(self, orig: Any) -> Any:
        meter = self

        @functools.wraps(orig)
        def save(*args: Any, **kwargs: Any) -> Any:
            if meter._depth or not meter._mine():
                return orig(*args, **kwargs)
            meter._depth += 1
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                meter._depth -= 1
                meter.ckpt += dt
                if meter._eval_t0 is not None:
                    meter._ckpt_in_eval += dt

        return save

    def _switch(self, module: Any, mode: bool) -> None:
        now = time.perf_counter()
        if not mode and getattr(module, "training", False) and self._eval_t0 is None:
            self._eval_t0, self._ckpt_in_eval = now, 0.0
        elif mode and self._eval_t0 is not None:
            self.eval += max(now - self._eval_t0 - self._ckpt_in_eval, 0.0)
            self._eval_t0 = None

    def take(self) -> tuple[float, float]:
        """Training thread, at an optimizer step: this step's (checkpoint, eval) seconds."""
        self.thread = threading.get_ident()
        if self._eval_t0 is not None:
            # still in eval mode at the optimizer step: training in eval mode, not a pause
            self._eval_t0 = None
            self.trained_in_eval += 1
        out = (self.ckpt, self.eval)
        self.ckpt = self.eval = 0.0
        return out

    def uninstall(self) -> None:
        self.stopped = True
        for patch in self._saves.values():
            patches.restore(patch)
        self._saves.clear()
        if self._module_cls is not None:
            patches.restore(self._train_patch)
            self._module_cls = None
