"""One rank's DataLoader worker blocks; the others wait for it in DDP's gradient all-reduce."""

from __future__ import annotations

import threading

import torch
from hang_common import announce, parse_args, setup, train_step
from torch.utils.data import DataLoader, Dataset


class ShardDataset(Dataset):
    def __init__(self, blocks_at: int | None) -> None:
        self.blocks_at = blocks_at

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.blocks_at is not None and i >= self.blocks_at:
            threading.Event().wait()  # a read that never returns (a stuck mount)
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), torch.randn(1, generator=g)


def main() -> None:
    args = parse_args()
    rank, _, model, optimizer = setup(args)
    batch = 8
    blocks_at = (args.healthy_steps + 1) * batch if rank == args.odd_rank else None
    loader = DataLoader(ShardDataset(blocks_at), batch_size=batch, num_workers=1, prefetch_factor=1)
    for step, (x, y) in enumerate(loader):
        train_step(model, optimizer, x, y)
        if step + 1 == args.healthy_steps:
            announce(args.ready_dir)


if __name__ == "__main__":
    main()
