"""Lightning's DeepSpeed strategy at ZeRO stage 3, on 2 CPU processes with gloo: a TEST HARNESS.

Lightning refuses DeepSpeed without CUDA in two places (``DeepSpeedStrategy.setup_environment``
wants a ``CUDAAccelerator``; ``setup_distributed`` checks the device indices against the local
ranks, which CPU devices have none of). ``CPUDeepSpeedStrategy`` skips exactly those two checks,
and gives its CPU device the local rank as index (the engine reads ``device_rank`` from it), so
that the real strategy, the real DeepSpeed engine and ZeRO-3's real partitioning run here;
nothing else differs from a GPU run. It is not a supported way to train on CPU.

The LightningModule holds ``self.net = nn.Sequential(...)``; ``configure_optimizers`` returns a
torch AdamW and a StepLR stepped every optimizer step. A callback logs, after every optimizer
step, ``global_step``, the LR and the sum of the full (gathered) parameters
(fw_common.StepLog's format) and announces readiness.

``--verify-checkpoint PATH``: load a probe checkpoint's ``model`` strictly into a fresh
``Regressor`` (no DeepSpeed), print ``PROBE-VERIFY {json}``, exit.

Run: ``DS_ACCELERATOR=cpu PROBE=1 python fw_lightning_deepspeed.py --ready-dir D --stop-file F``
(Lightning starts the second process itself).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
import warnings

import torch
import torch.nn as nn
from fw_common import add_common_args, announce, verify_consolidated

DIM, LR = 16, 0.01


def regressor_class():  # noqa: ANN201 - Lightning is imported only when training or verifying
    import lightning as L

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, 32),
                                     nn.ReLU(), nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):  # noqa: ANN201
            opt = torch.optim.AdamW(self.parameters(), lr=LR)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    return Regressor


def cpu_strategy(stage: int):  # noqa: ANN201
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy

    class CPUDeepSpeedStrategy(DeepSpeedStrategy):
        """DeepSpeedStrategy without its two CUDA-only checks (see the module docstring)."""

        def setup_environment(self) -> None:
            DDPStrategy.setup_environment(self)  # skips the CUDAAccelerator check

        @property
        def root_device(self) -> torch.device:
            # DeepSpeedEngine takes its device_rank from root_device.index (None on "cpu")
            return torch.device("cpu", self.local_rank)

        def setup_distributed(self) -> None:
            from lightning.fabric.utilities.seed import reset_seed

            reset_seed()  # skips _validate_device_index_selection (CPU devices have no index)
            self.set_world_ranks()
            self._init_deepspeed_distributed()

    return CPUDeepSpeedStrategy(stage=stage, process_group_backend="gloo",
                                config={"zero_optimization": {
                                    "stage": stage, "stage3_param_persistence_threshold": 0},
                                    "train_micro_batch_size_per_gpu": 16,
                                    "gradient_clipping": 1.0,
                                    "zero_allow_untested_optimizer": True})


def full_param_sum(module: nn.Module) -> float:
    import deepspeed

    params = list(module.parameters())
    with deepspeed.zero.GatheredParameters(params):
        return float(sum(p.detach().double().sum() for p in params))


def train(args: argparse.Namespace) -> None:
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class StepLogger(L.Callback):
        def __init__(self) -> None:
            self.f = None
            self.announced = False

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
            if self.f is None and args.log_dir:  # RANK is set once the strategy is set up
                os.makedirs(args.log_dir, exist_ok=True)
                self.f = open(os.path.join(args.log_dir, f"rank{trainer.global_rank}.jsonl"),
                              "a", buffering=1)
            lr = float(trainer.optimizers[0].param_groups[0]["lr"])
            total = full_param_sum(pl_module)  # a collective: every rank, every step
            if self.f is not None:
                self.f.write(json.dumps({"global_step": trainer.global_step, "lr": lr,
                                         "param_sum": total}) + "\n")
            if not self.announced:
                self.announced = True
                announce(args.ready_dir)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if args.stop_file and os.path.exists(args.stop_file):
                trainer.should_stop = True

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, DIM, generator=g)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True) * 0.1), batch_size=16,
                        shuffle=True, num_workers=0)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=cpu_strategy(args.stage),
                        max_steps=args.max_steps, max_epochs=-1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[StepLogger()])
    trainer.fit(regressor_class()(), loader)


def verify(path: str) -> None:
    verify_consolidated(path, regressor_class()())


def main() -> None:
    p = argparse.ArgumentParser()
    add_common_args(p)
    p.add_argument("--stage", type=int, default=3)
    args = p.parse_args()
    if args.verify_checkpoint:
        verify(args.verify_checkpoint)
        return
    warnings.filterwarnings("ignore")
    train(args)
    # Lightning's and DeepSpeed's objects: collecting them at interpreter exit was most of the
    # job's end (test teardown waits for it). Exempt them; the agent's end handling still runs.
    gc.freeze()


if __name__ == "__main__":
    main()
