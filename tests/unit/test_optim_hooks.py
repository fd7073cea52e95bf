"""Global optimizer hooks added and removed from another thread never break a step in progress
(`probe_agent.stop()` from an eval killed an injected process's training loop with
`RuntimeError: OrderedDict mutated during iteration`)."""

from __future__ import annotations

import threading
import time

import torch
from torch.optim import optimizer as optimizer_mod

from probe_agent import optim_hooks


def _race(add, seconds: float) -> list[BaseException]:
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    # hooks that yield the GIL inside the loop over the global hooks, as real ones may
    slow = [optim_hooks.register(optimizer_mod, "post", lambda *a: time.sleep(0))
            for _ in range(3)]
    stop, errors = threading.Event(), []

    def train() -> None:
        while not stop.is_set():
            try:
                opt.step()
            except RuntimeError as e:
                errors.append(e)
                return

    t = threading.Thread(target=train)
    t.start()
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end and not errors:
            add().remove()
    finally:
        stop.set()
        t.join()
        for h in slow:
            h.remove()
    return errors


def test_torchs_own_register_and_remove_break_a_step_in_progress():
    """The hazard is real here: without it the next test would prove nothing."""
    errors = _race(lambda: optimizer_mod.register_optimizer_step_post_hook(lambda *a: None), 20)
    assert errors and "mutated during iteration" in str(errors[0])


def test_copy_on_write_hooks_never_do():
    errors = _race(lambda: optim_hooks.register(optimizer_mod, "post", lambda *a: None), 5)
    assert not errors, errors
