"""Does the agent's step agree with the framework's own optimizer-step counter? (issue 17)

Trains a tiny model for ``--steps`` optimizer steps with gradient accumulation 2 under the
Hugging Face Trainer (Accelerate wraps the optimizer in ``AcceleratedOptimizer``) or Lightning
(``accumulate_grad_batches=2``, SGD; Lightning wraps it in ``LightningOptimizer``), with the agent
started by PROBE=1. After every micro-batch a callback records the pair (framework counter, agent
step clock). At the end it writes JSON to ``--out``: those pairs, the framework's final counter,
the step clock and ``max(step)`` of ``python.steps``.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn as nn
from torch.utils.data import Dataset

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class Pairs(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(8, generator=g), "y": torch.randn(1, generator=g)}


class Regressor(nn.Module):
    """Returns ``{"loss": ...}`` as the HF Trainer expects of a model."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.mse_loss(self.net(x), y)}


def clock() -> int:
    from probe_agent.process import current

    return current().stepclock.current_step


#: The framework's own loss per optimizer step: {step: loss}, filled by each runner.
OWN_LOSS: dict[int, float] = {}


def run_hf(steps: int, out_dir: str) -> tuple[int, list[tuple[int, int]]]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    seen: list[tuple[int, int]] = []

    class Record(TrainerCallback):
        def on_substep_end(self, args, state, control, **kw):  # a micro-batch without a step
            seen.append((state.global_step, clock()))

        def on_step_end(self, args, state, control, **kw):  # after the optimizer step
            seen.append((state.global_step, clock()))

        def on_log(self, args, state, control, logs=None, **kw):  # the Trainer's own loss
            if logs and "loss" in logs:
                OWN_LOSS[state.global_step] = float(logs["loss"])

    args = TrainingArguments(
        output_dir=out_dir, max_steps=steps, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, learning_rate=1e-3, lr_scheduler_type="cosine",
        report_to=[], save_strategy="no", logging_strategy="steps", logging_steps=1,
        use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = Trainer(model=Regressor(), args=args, train_dataset=Pairs(), callbacks=[Record()])
    trainer.train()
    return trainer.state.global_step, seen


def run_lightning(steps: int, out_dir: str) -> tuple[int, list[tuple[int, int]]]:
    import lightning as L

    seen: list[tuple[int, int]] = []

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.net(batch["x"]), batch["y"])

        def configure_optimizers(self):
            # SGD keeps no step count of its own: the clock counts from the first step it sees
            opt = torch.optim.SGD(self.parameters(), lr=1e-3, momentum=0.9)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=2)]

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append((trainer.global_step, clock()))
            # Lightning's loss of the micro-batch, already divided by accumulate_grad_batches:
            # the step's loss is their sum (the mean of training_step's losses)
            step = batch_idx // 2 + 1
            OWN_LOSS[step] = OWN_LOSS.get(step, 0.0) + float(outputs["loss"])

    trainer = L.Trainer(max_steps=steps, accumulate_grad_batches=2, accelerator="cpu",
                        devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[Record()], default_root_dir=out_dir)
    loader = torch.utils.data.DataLoader(Pairs(), batch_size=4)
    trainer.fit(Module(), loader)
    return trainer.global_step, seen


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--framework", choices=("hf", "lightning"), required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    run = run_hf if args.framework == "hf" else run_lightning
    final, seen = run(args.steps, os.path.dirname(os.path.abspath(args.out)))

    from probe_agent.process import current

    agent = current()
    agent.collectors.steps.flush(final=True)
    agent.store.flush()
    steps_max = agent.store.query("SELECT max(step) FROM python.steps").rows[0][0]
    recorded = agent.store.query("SELECT step, loss, loss_source FROM python.steps").rows
    with open(args.out, "w") as f:
        json.dump({"framework_step": final, "clock_step": agent.stepclock.current_step,
                   "steps_max": steps_max, "seen": seen,
                   "own_loss": OWN_LOSS, "loss": {s: [v, src] for s, v, src in recorded},
                   "optimizers": agent.stepclock.state()["optimizers"]}, f)


if __name__ == "__main__":
    main()
