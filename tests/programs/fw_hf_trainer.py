"""A Hugging Face ``transformers.Trainer`` job as its users write it (issue 17), tiny and on CPU.

A GPT-2 built from a config (nothing downloaded), an in-memory dataset of random token ids,
``gradient_accumulation_steps=2``, a cosine schedule, AdamW (the Trainer's default), trained for
``--max-steps`` (many: the job runs until ``--stop-file`` appears). The Trainer wraps optimizer
and model through Accelerate (``AcceleratedOptimizer``), and its LambdaLR's ``.optimizer`` is that
wrapper, not the torch optimizer that steps.

A callback does what fw_common.StepLog describes after every optimizer step (readiness, the
per-step JSON log with ``state.global_step``, the step sleep, the stop file).
``--slow-module transformer.h.0.mlp --slow-ms 20`` makes that layer's forward slow.
``--verify-checkpoint PATH`` loads a probe checkpoint into a fresh Trainer (its own optimizer and
scheduler, created as ``train()`` creates them), prints ``PROBE-VERIFY {json}`` and exits.

Run: ``PROBE=1 python tests/programs/fw_hf_trainer.py --ready-dir D --stop-file F``.
"""

from __future__ import annotations

import argparse
import gc
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from fw_common import StepLog, add_common_args, make_slow, param_sum, print_json  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

SEQ, VOCAB, LR = 16, 128, 1e-3


class RandomTokens(torch.utils.data.Dataset):
    """Random token sequences; labels are the inputs (causal LM)."""

    def __init__(self, n: int = 256) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class ProbeTestCallback(TrainerCallback):
    def __init__(self, log: StepLog) -> None:
        self.steps = log

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kw):  # noqa: ANN001
        # after optimizer.step(), lr_scheduler.step() and global_step += 1: the LR logged is
        # the one the next step uses
        lr = float(optimizer.param_groups[0]["lr"])
        if self.steps.step_done(state.global_step, lr, model):
            control.should_training_stop = True
        return control


def build(args: argparse.Namespace, out_dir: str) -> Trainer:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    make_slow(model, args.slow_module, args.slow_ms)
    targs = TrainingArguments(
        output_dir=out_dir, max_steps=args.max_steps, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, learning_rate=LR, lr_scheduler_type="cosine",
        warmup_steps=0, logging_strategy="no", save_strategy="no", report_to="none",
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=0,
    )
    return Trainer(model=model, args=targs, train_dataset=RandomTokens(),
                   callbacks=[ProbeTestCallback(StepLog(args))])


def verify(trainer: Trainer, path: str) -> None:
    """Load a probe checkpoint the way a Trainer user would resume from it, and report."""
    from probe_agent.actions.checkpoint import load

    state = load(path)
    trainer.create_optimizer_and_scheduler(num_training_steps=trainer.args.max_steps)
    fresh_sum = param_sum(trainer.model)
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.lr_scheduler.load_state_dict(state["scheduler"])
    opt_steps = {int(s["step"]) for s in trainer.optimizer.state_dict()["state"].values()}
    print_json({"step": state["step"], "framework": state.get("framework"),
                "fresh_param_sum": fresh_sum, "param_sum": param_sum(trainer.model),
                "optimizer_steps": sorted(opt_steps),
                "scheduler_last_epoch": trainer.lr_scheduler.last_epoch,
                "lr": float(trainer.optimizer.param_groups[0]["lr"]),
                "scheduler_lr": trainer.lr_scheduler.get_last_lr()[0]})


def main() -> None:
    p = argparse.ArgumentParser()
    add_common_args(p)
    p.add_argument("--out-dir", default=None, help="Trainer output_dir (default: a temp dir)")
    args = p.parse_args()
    torch.set_num_threads(1)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        trainer = build(args, args.out_dir or tmp)
        if args.verify_checkpoint:
            verify(trainer, args.verify_checkpoint)
            return
        trainer.train()


if __name__ == "__main__":
    main()
    # transformers' objects: collecting them at interpreter exit was half of the job's end (the
    # test's teardown waits for it). Exempt them; the agent's end handling still runs.
    gc.freeze()
