"""A Lightning token job for the throughput tests: a LightningModule whose ``training_step``
calls ``self.net(input_ids=...)`` with integer ids [B, T] from a dict batch, gradient
accumulation 2, a warmup+cosine LambdaLR stepped every optimizer step that ends at
``--sched-total`` while ``Trainer(max_steps=--max-steps)`` runs further (the guide's trap).

Announces (tests/programs/ready.py) at ``--ready-step`` optimizer steps with its batch,
context, accumulation and schedule; holds at ``--max-steps - 5`` until ``--stop-file`` exists,
so the job is still alive whenever the test asks.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from ready import announce
from token_job import warmup_cosine
from torch.utils.data import DataLoader, Dataset

VOCAB, DIM = 64, 64


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.wte(input_ids)))


class TokenLM(L.LightningModule):
    def __init__(self, warmup: int, total: int) -> None:
        super().__init__()
        self.net = Net()
        self.warmup, self.total = warmup, total

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int):  # noqa: ANN201
        ids = batch["input_ids"]
        logits = self.net(input_ids=ids)
        return F.cross_entropy(logits.flatten(0, 1), ids.flatten())

    def configure_optimizers(self):  # noqa: ANN201
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(self.warmup, self.total))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Tokens(Dataset):
    def __init__(self, context: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (4096, context), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i]}


class Pace(L.Callback):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
        a, step = self.args, trainer.global_step
        if step == a.ready_step and (batch_idx + 1) % a.accum == 0:
            announce(a.ready_dir, 0, batch=a.batch, context=a.context, accum=a.accum,
                     warmup=a.warmup, sched_total=a.sched_total, max_steps=a.max_steps)
        time.sleep(0.01)
        while step >= a.max_steps - 5 and not os.path.exists(a.stop_file):
            time.sleep(0.05)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--ready-step", type=int, default=20)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=16)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--sched-total", type=int, default=40)
    p.add_argument("--max-steps", type=int, default=100)
    args = p.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", module="lightning")
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        max_steps=args.max_steps, max_epochs=-1, accelerator="cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        accumulate_grad_batches=args.accum, callbacks=[Pace(args)],
    )
    trainer.fit(TokenLM(args.warmup, args.sched_total),
                train_dataloaders=DataLoader(Tokens(args.context), batch_size=args.batch))


if __name__ == "__main__":
    main()
