"""Adapt build-nanogpt's ``train_gpt2.py`` (karpathy/build-nanogpt, unmodified upstream file) to
this CPU VM, for the throughput closing check: ``probe throughput`` on a script nobody here wrote.

Only what cannot run here is changed, each by an exact text replacement that must match (the
script fails loudly if upstream moved): DDP on gloo instead of NCCL/CUDA; a small GPT config
(2 layers, 128 wide, vocab 1024, T=128, B=4, two micro-batches per step); 60 steps with a
10-step warmup; no HellaSwag or tiktoken (both download at run time); token shards written as
``edu_fineweb10B/*.npy`` of random tokens in the upstream format, so the data loader is upstream's.
The training loop, the manual LR schedule, the autocast(bfloat16) forward, gradient accumulation
and clipping are upstream's.

    python bench/real/nanogpt_cpu.py UPSTREAM/train_gpt2.py OUTDIR
    cd OUTDIR && PROBE=1 torchrun --nproc_per_node 2 train_gpt2_cpu.py   # then: probe throughput
    bash bench/real/nanogpt_overhead.sh OUTDIR 4 [on]                       # the agent's cost
"""

from __future__ import annotations

import os
import sys

import numpy as np
from edits import adapt_file  # bench/real/edits.py: run as a script, its folder is on sys.path

EDITS = [
    ("from hellaswag import render_example, iterate_examples\n", ""),
    ("import tiktoken\n", ""),
    ('enc = tiktoken.get_encoding("gpt2")\n', ""),
    ('    assert torch.cuda.is_available(), "for now i think we need CUDA for DDP"\n', ""),
    ("init_process_group(backend='nccl')", "init_process_group(backend='gloo')"),
    ("    device = f'cuda:{ddp_local_rank}'\n    torch.cuda.set_device(device)\n",
     "    device = 'cpu'\n"),
    ("total_batch_size = 524288 # 2**19, ~0.5M, in number of tokens",
     "total_batch_size = 4 * 128 * 2 * int(os.environ.get('WORLD_SIZE', 1))"),
    ("B = 64 # micro batch size", "B = 4 # micro batch size"),
    ("T = 1024 # sequence length", "T = 128 # sequence length"),
    ("model = GPT(GPTConfig(vocab_size=50304))",
     "model = GPT(GPTConfig(block_size=128, vocab_size=1024, n_layer=2, n_head=4, n_embd=128))"),
    ("model = DDP(model, device_ids=[ddp_local_rank])", "model = DDP(model)"),
    ("warmup_steps = 715", "warmup_steps = 10"),
    ("max_steps = 19073", "max_steps = int(os.environ.get('MAX_STEPS', 60))"),
    ("            val_loss_steps = 20", "            val_loss_steps = 2"),
    ("if (step % 250 == 0 or last_step) and (not use_compile):", "if False:"),
    ("if ((step > 0 and step % 250 == 0) or last_step) and (not use_compile):", "if False:"),
]


def main() -> None:
    upstream, out = sys.argv[1], sys.argv[2]
    os.makedirs(os.path.join(out, "edu_fineweb10B"), exist_ok=True)
    adapt_file(upstream, os.path.join(out, "train_gpt2_cpu.py"), EDITS)
    rng = np.random.default_rng(0)
    for split in ("train", "val"):  # upstream's shard format: uint16 token ids in .npy
        np.save(os.path.join(out, "edu_fineweb10B", f"edufineweb_{split}_000000.npy"),
                rng.integers(0, 1024, size=200_000, dtype=np.uint16))


if __name__ == "__main__":
    main()
