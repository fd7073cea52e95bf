"""2-rank Lightning DDP on CPU (gloo) started by Lightning's own launcher; one rank gets stuck
in a callback (issue 17).

Run as ``PROBE=1 python lightning_ddp_stuck.py ...``: Lightning re-runs this script for rank 1
with ``LOCAL_RANK=1`` in its environment, and the first process becomes rank 0. After
``--stuck-at`` optimizer steps every rank writes ``rank{N}.json`` ({rank, pid, url}) into
``--ready-dir``; then ``--odd-rank`` sleeps in ``on_train_batch_end`` (``wait_for_the_lock``)
until ``--stop-file`` exists, and the other rank waits for it in DDP's gradient all-reduce.
"""

from __future__ import annotations

import argparse
import os
import time

import lightning as L
import torch
import torch.nn as nn
from ready import announce  # tests/programs/ready.py, beside this script


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StuckCallback(L.Callback):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if os.path.exists(self.args.stop_file):
            trainer.should_stop = True  # every rank sees the file: they stop together
        if trainer.global_step != self.args.stuck_at:
            return
        announce(self.args.ready_dir, trainer.global_rank)
        if trainer.global_rank == self.args.odd_rank:
            wait_for_the_lock(self.args.stop_file)


def wait_for_the_lock(stop_file: str) -> None:
    """A callback that blocks on something outside the job (a lock file, a slow upload)."""
    while not os.path.exists(stop_file):
        time.sleep(0.1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--odd-rank", type=int, default=1)
    p.add_argument("--stuck-at", type=int, default=3)
    args = p.parse_args()
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
    trainer = L.Trainer(strategy="ddp", devices=2, accelerator="cpu", max_steps=10_000,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[StuckCallback(args)])
    trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=8))


if __name__ == "__main__":
    main()
