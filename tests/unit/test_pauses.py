"""The pause meter (collectors/pauses.py): eval intervals between optimizer steps count, a
model left in eval mode through the optimizer step trains in eval mode (no pause), and saves on
another thread do not pause the training thread."""

from __future__ import annotations

import io
import threading
import time

import torch

from probe_agent import patches
from probe_agent.collectors.pauses import PauseMeter


def test_eval_between_steps_counts_and_training_in_eval_mode_does_not():
    meter = PauseMeter()
    meter.install()
    try:
        model = torch.nn.Linear(4, 4)
        meter.take()  # the first step boundary: this is the training thread
        # GIVEN an eval pass of ~20 ms between two steps
        model.eval()
        time.sleep(0.02)
        model.train()
        ck, ev = meter.take()
        assert ck == 0 and 0.02 <= ev < 0.2
        # WHEN a job trains with the model in eval mode (dropout off) through the next step
        model.eval()
        time.sleep(0.01)
        ck, ev = meter.take()
        # THEN that is no eval pause, and it is counted as such
        assert ev == 0 and meter.trained_in_eval == 1
        model.train()
        assert meter.take() == (0.0, 0.0)  # train() after the step closes nothing
    finally:
        meter.uninstall()


def test_a_save_on_another_thread_does_not_pause_the_step():
    meter = PauseMeter()
    meter.install()
    try:
        meter.take()
        t = threading.Thread(target=torch.save, args=({"x": torch.zeros(1 << 20)}, io.BytesIO()))
        t.start()
        t.join()
        assert meter.take() == (0.0, 0.0)
        torch.save({"x": torch.zeros(1 << 20)}, io.BytesIO())
        assert meter.take()[0] > 0
    finally:
        meter.uninstall()
    assert patches.ours(torch.save) is None
