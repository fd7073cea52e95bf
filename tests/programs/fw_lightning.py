"""A Lightning job as its users write it (issue 17): a LightningModule holding ``self.net =
nn.Sequential(...)``, a StepLR stepped every optimizer step, one process on CPU.

Lightning calls ``self.net`` from ``training_step``; the LightningModule itself is never called,
so module names must still come out as ``net.0``, ``net.2``. Trains for ``--max-steps`` (many:
the job runs until ``--stop-file`` appears). A callback does what fw_common.StepLog describes after
every optimizer step (``trainer.global_step`` is the framework's count).
``--slow-module net.2 --slow-ms 20`` makes that layer's forward slow.
``--verify-checkpoint PATH`` loads a probe checkpoint into a fresh LightningModule and the
optimizer and scheduler its ``configure_optimizers`` makes, prints ``PROBE-VERIFY {json}``, exits.

Run: ``PROBE=1 python tests/programs/fw_lightning.py --ready-dir D --stop-file F``.
"""

from __future__ import annotations

import argparse
import gc
import warnings

import lightning as L
import torch
import torch.nn as nn
from fw_common import StepLog, add_common_args, make_slow, param_sum, print_json
from torch.utils.data import DataLoader, TensorDataset

DIM, LR = 16, 0.02


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                 nn.Linear(64, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):  # noqa: ANN201
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):  # noqa: ANN201
        opt = torch.optim.SGD(self.parameters(), lr=LR, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class ProbeTestCallback(L.Callback):
    def __init__(self, log: StepLog) -> None:
        self.steps = log

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
        # after optimizer.step() and the step-interval scheduler: the LR the next step uses
        lr = float(trainer.optimizers[0].param_groups[0]["lr"])
        if self.steps.step_done(trainer.global_step, lr, pl_module):
            trainer.should_stop = True


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, DIM, generator=g)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True) * 0.1), batch_size=32,
                      shuffle=True, num_workers=0)


def verify(path: str) -> None:
    from probe_agent.actions.checkpoint import load

    state = load(path)
    module = Regressor()
    conf = module.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    fresh = param_sum(module)
    module.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    print_json({"step": state["step"], "framework": state.get("framework"),
                "fresh_param_sum": fresh, "param_sum": param_sum(module),
                "momentum_buffers": sum(1 for s in opt.state.values() if "momentum_buffer" in s),
                "scheduler_last_epoch": sched.last_epoch,
                "lr": float(opt.param_groups[0]["lr"]), "scheduler_lr": sched.get_last_lr()[0]})


def main() -> None:
    p = argparse.ArgumentParser()
    add_common_args(p)
    args = p.parse_args()
    torch.set_num_threads(1)
    # Lightning's advice about num_workers and logging is noise for a tiny CPU job
    warnings.filterwarnings("ignore", module="lightning")
    if args.verify_checkpoint:
        verify(args.verify_checkpoint)
        return
    L.seed_everything(0, verbose=False)
    module = Regressor()
    make_slow(module, args.slow_module, args.slow_ms)
    trainer = L.Trainer(
        max_steps=args.max_steps, max_epochs=-1, accelerator="cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ProbeTestCallback(StepLog(args))],
    )
    trainer.fit(module, train_dataloaders=loader())


if __name__ == "__main__":
    main()
    # Lightning's objects: collecting them at interpreter exit was half of the job's end (the
    # test's teardown waits for it). Exempt them; the agent's end handling still runs.
    gc.freeze()
