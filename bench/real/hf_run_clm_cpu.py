"""Adapt HF transformers' ``examples/pytorch/language-modeling/run_clm.py`` (the unmodified
upstream file, the Trainer on DDP) to this CPU VM, offline: a GPT-2 trained from scratch on 2
gloo ranks for `probe doctor` / `memory` / `slow` / `throughput`, and the agent's cost
(hf_overhead.sh).

Only what cannot run here is changed, each by an exact text replacement that must match:
``import evaluate`` goes (not installed; upstream uses it only under ``--do_eval``, whose
``evaluate.load`` downloads a metric), and a TrainerCallback prints each optimizer step's wall
time (``step_s: N S``) so the overhead arms are read from the script's own clock. Nothing is
downloaded at run time: the data are local text files of sentences from a small grammar (so the
loss falls), the tokenizer is a 512-token byte-level BPE trained here and saved as a
GPT2TokenizerFast, the model is ``--model_type gpt2`` with ``--config_overrides``.
``--use_cpu`` is in the arguments: without it accelerate leaves the Trainer undistributed on a
machine without an accelerator (its log says "distributed training: False") and torchrun's two
ranks each train alone (`probe doctor`: RANKS NEVER COMMUNICATE, rightly).

    python bench/real/hf_run_clm_cpu.py UPSTREAM/run_clm.py OUTDIR
    cd OUTDIR && HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PROBE=1 torchrun --nproc_per_node 2 \\
        --rdzv-backend=c10d --rdzv-endpoint=localhost:0 run_clm_cpu.py $(cat args.txt) \\
        --max_steps 400
    bash bench/real/hf_overhead.sh OUTDIR 4                 # the agent's cost, default vs off
"""

from __future__ import annotations

import os
import random
import sys

from edits import adapt_file  # bench/real/edits.py: run as a script, its folder is on sys.path

STEP_CLOCK = '''
    import time as _time
    from transformers import TrainerCallback

    class _StepClock(TrainerCallback):  # bench/real/hf_run_clm_cpu.py: the script's own step time
        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = _time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            print(f"step_s: {state.global_step} {_time.perf_counter() - self.t0:.6f}", flush=True)

    trainer.add_callback(_StepClock())

    # Training
'''

EDITS = [
    ("import evaluate\n", ""),
    ("\n    # Training\n", STEP_CLOCK),
]

ARGS = (
    "--model_type gpt2"
    " --config_overrides n_layer=4,n_head=4,n_embd=128,n_positions=128,vocab_size=512"
    " --tokenizer_name tok --train_file train.txt --validation_file valid.txt --block_size 128"
    " --do_train --use_cpu --per_device_train_batch_size 8 --learning_rate 1e-3 --warmup_steps 20"
    " --logging_steps 10 --save_strategy no --report_to none --dataloader_num_workers 0"
    " --output_dir out"
)


def sentences(n: int, seed: int) -> list[str]:
    """A small grammar: learnable structure, so a healthy run's loss falls."""
    rng = random.Random(seed)
    subj = ["the cat", "a dog", "my friend", "the old man", "a small bird", "the teacher"]
    verb = ["sees", "likes", "finds", "carries", "watches", "follows"]
    obj = ["the ball", "a red box", "the garden", "an apple", "the river", "a long road"]
    tail = ["today.", "at night.", "in the morning.", "again.", "slowly.", "with care."]
    return [" ".join(rng.choice(w) for w in (subj, verb, obj, tail)) for _ in range(n)]


def tokenizer(texts: list[str], out: str) -> None:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=512, min_frequency=1,
                            special_tokens=["<|endoftext|>"])
    tok = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, model_max_length=128,
                            bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                            unk_token="<|endoftext|>")
    tok.save_pretrained(out)


def main() -> None:
    upstream, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    adapt_file(upstream, os.path.join(out, "run_clm_cpu.py"), EDITS)
    train, valid = sentences(40_000, 0), sentences(2_000, 1)
    for name, lines in (("train.txt", train), ("valid.txt", valid)):
        with open(os.path.join(out, name), "w") as f:
            f.write("\n".join(lines) + "\n")
    tokenizer(train, os.path.join(out, "tok"))
    with open(os.path.join(out, "args.txt"), "w") as f:
        f.write(ARGS + "\n")


if __name__ == "__main__":
    main()
