"""Training numerics gone wrong in build-nanogpt's ``train_gpt2.py`` (karpathy/build-nanogpt,
unmodified upstream file), for issue 40's closing check: what `probe doctor` says about a loss
spike, a NaN and a stall on a script nobody here wrote, with nothing logged to the agent.

The script is adapted to this CPU VM exactly as for the throughput check (nanogpt_cpu.py's
edits). Its token shards (upstream's format) are a learnable stream this time: each token is a
fixed random successor of the one before 90% of the time, else uniform, so the loss falls from
ln(1024) = 6.93 toward ~1.1 within a hundred steps, as a real corpus's does. The faults:

- ``spike``: the tokens step ``--at`` reads are uniform noise (a corrupt stretch of the
  shard): that one step's loss jumps to ~6.9, the next is back. Nothing in the script changes.
- ``stall``: upstream's ``max_lr = 6e-4`` becomes ``6e-8``: the loss sits near ln(1024).
- ``nan``: nothing here. While the job runs, `probe eval` writes NaN into one row of the
  embedding (``raw_model.transformer.wte.weight``): the job's next batch holding that token
  makes a NaN, as a corrupted weight does. The runner script does it.

    python bench/real/nanogpt_numerics.py UPSTREAM/train_gpt2.py OUTDIR FAULT [--at STEP]
    bash bench/real/nanogpt_numerics.sh UPSTREAM/train_gpt2.py OUTDIR   # all three, doctor's output
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from edits import adapt_file  # bench/real/edits.py: run as a script, its folder is on sys.path
from nanogpt_cpu import EDITS

#: Tokens one optimizer step reads over both ranks: B x T x micro-batches x world (2 ranks).
TOKENS_PER_STEP = 4 * 128 * 2 * 2
VOCAB = 1024

FAULT_EDITS = {
    "spike": [],
    "nan": [],
    "stall": [("max_lr = 6e-4", "max_lr = 6e-8")],
}


def tokens(n: int, seed: int) -> np.ndarray:
    """A stream a small GPT learns: a fixed successor per token, 90% of the time."""
    rng = np.random.default_rng(seed)
    successor = np.random.default_rng(0).permutation(VOCAB)
    out = np.empty(n, dtype=np.int64)
    out[0] = 0
    noise = rng.random(n) < 0.1
    uniform = rng.integers(0, VOCAB, size=n)
    for i in range(1, n):
        out[i] = uniform[i] if noise[i] else successor[out[i - 1]]
    return out.astype(np.uint16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("upstream")
    ap.add_argument("out")
    ap.add_argument("fault", choices=sorted(FAULT_EDITS))
    ap.add_argument("--at", type=int, default=120, help="the spike's step")
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "edu_fineweb10B"), exist_ok=True)
    adapt_file(args.upstream, os.path.join(args.out, "train_gpt2_cpu.py"),
               EDITS + FAULT_EDITS[args.fault])
    for split, seed in (("train", 1), ("val", 2)):
        toks = tokens(2_000_000, seed)
        if split == "train" and args.fault == "spike":
            # the loader reads step S's tokens at [S x TOKENS_PER_STEP, (S + 1) x ...] (rank r
            # from r x B x T within them): all of them noise, on both ranks
            a = args.at * TOKENS_PER_STEP
            toks[a:a + TOKENS_PER_STEP + 1] = np.random.default_rng(3).integers(
                0, VOCAB, size=TOKENS_PER_STEP + 1, dtype=np.uint16)
        np.save(os.path.join(args.out, "edu_fineweb10B", f"edufineweb_{split}_000000.npy"), toks)


if __name__ == "__main__":
    main()
