"""Adapt ``litgpt pretrain`` (Lightning-AI/litgpt, the unmodified upstream package: its
``litgpt/`` folder) to this CPU VM, offline: Lightning Fabric's own launcher starts rank 1 from
rank 0 (``--devices 2``), the model is ``torch.compile``'d as upstream does, for `probe doctor`
/ `memory` / `slow` / `throughput`.

Only what cannot run here is changed, by an exact text replacement that must match: with more
than one device upstream picks ``FSDPStrategy`` (HYBRID_SHARD), which Fabric refuses without a
GPU ("FSDP is only available on GPU"); on CPU it is ``"ddp"`` (gloo). Nothing is downloaded:
the data are a DataModule of token ids from a small repeating grammar written here
(``tinydata.py``; upstream's TinyLlama and TextFiles modules need litdata and a download), the
model is pythia-14m's architecture made smaller (2 layers, 128 wide, vocab 512, block 128) in
``pretrain.yaml``. The CLI needs jsonargparse (not in the venv: installed with ``--no-deps
--target`` beside it, since ``pip install litgpt`` would move huggingface_hub 2.4 -> 1.3).

    python bench/real/litgpt_pretrain_cpu.py LITGPT_CHECKOUT OUTDIR
    pip install --no-deps --target OUTDIR/deps "jsonargparse[signatures]==4.41.0" \\
        docstring_parser typeshed_client
    cd OUTDIR && PYTHONPATH=$PYTHONPATH:OUTDIR/deps:OUTDIR/src:OUTDIR PROBE=1 \\
        python -m litgpt pretrain --config pretrain.yaml --train.max_tokens 4096000
"""

from __future__ import annotations

import os
import shutil
import sys

from edits import adapt_file  # bench/real/edits.py: run as a script, its folder is on sys.path

EDITS = [
    ('        strategy = FSDPStrategy(auto_wrap_policy={Block}, state_dict_type="full", '
     'sharding_strategy="HYBRID_SHARD")\n',
     '        strategy = "ddp"\n'),
]

TINYDATA = '''"""A local token stream for litgpt pretrain (no download, no litdata): sequences
drawn from 64 fixed 16-token "sentences", so the loss falls."""
import torch
from torch.utils.data import DataLoader, Dataset

from litgpt.data import DataModule


class _Seqs(Dataset):
    def __init__(self, n, length, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        base = torch.randint(0, vocab, (64, 16), generator=g)
        pick = torch.randint(0, 64, (n, length // 16 + 1), generator=g)
        self.data = base[pick].reshape(n, -1)[:, :length]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


class TinyTokens(DataModule):
    def __init__(self, vocab: int = 512, n_train: int = 20000, n_val: int = 64):
        super().__init__()
        self.vocab, self.n_train, self.n_val = vocab, n_train, n_val

    def connect(self, tokenizer=None, batch_size=1, max_seq_length=None, **kwargs):
        self.batch_size, self.seq_length = batch_size, max_seq_length + 1

    def train_dataloader(self):
        return DataLoader(_Seqs(self.n_train, self.seq_length, self.vocab, 0),
                          batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(_Seqs(self.n_val, self.seq_length, self.vocab, 1),
                          batch_size=self.batch_size)
'''

CONFIG = """model_name: pythia-14m
model_config:
  name: pythia-tiny
  hf_config: {org: EleutherAI, name: pythia-14m}
  block_size: 128
  vocab_size: 512
  padded_vocab_size: 512
  n_layer: 2
  n_head: 4
  n_embd: 128
  rotary_percentage: 0.25
  parallel_residual: true
  bias: true
out_dir: out
precision: 32-true
data:
  class_path: tinydata.TinyTokens
train:
  save_interval: 100000
  log_interval: 1
  global_batch_size: 8
  micro_batch_size: 4
  lr_warmup_steps: 10
  max_tokens: 2048000
  max_seq_length: 128
  max_norm: 1.0
  min_lr: 4.0e-05
eval:
  interval: 100000
  max_iters: 2
  initial_validation: false
  final_validation: false
devices: 2
logger_name: csv
"""


def main() -> None:
    checkout, out = sys.argv[1], sys.argv[2]
    src = os.path.join(out, "src", "litgpt")
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(os.path.join(checkout, "litgpt"), src)
    path = os.path.join(src, "pretrain.py")
    adapt_file(path, path, EDITS)
    for name, body in (("tinydata.py", TINYDATA), ("pretrain.yaml", CONFIG)):
        with open(os.path.join(out, name), "w") as f:
            f.write(body)


if __name__ == "__main__":
    main()
