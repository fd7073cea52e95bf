"""`probe doctor`'s check of ranks that never communicate: a job of several ranks in which no
rank recorded a single collective over many steps. Each rank then trains a copy of its own
(pytorch/examples' imagenet on CPU never wraps the model in DDP): the job is not data-parallel,
whatever its launcher says, and its checkpoints are one rank's model. Pure.

Collectives are counted from the explicit calls and the Flight Recorder (which sees DDP's
gradient all-reduces), so a DDP or FSDP job is never flagged while the recorder is on (it is by
default on gloo and NCCL in torch 2.13; ``TORCH_FR_BUFFER_SIZE=0`` turns it off).
"""

from __future__ import annotations

from typing import Any

from .checks import DoctorCheck, Evidence
from .findings import WARNING, Finding, RankDoc, Report, num, unrecorded

#: What to do, by who wraps the model. The HF Trainer wraps it itself (accelerate decides): on a
#: machine without an accelerator it sets up DDP only with ``use_cpu``; without it, torchrun's
#: ranks each run the whole Trainer alone ("distributed training: False" in run_clm.py's log),
#: and a DDP wrapper added by hand is not the fix.
PLAIN_NEXT = ("wrap the model: model = torch.nn.parallel.DistributedDataParallel(model) (CPU: no "
              "device_ids), or run one process if the copies are meant")
TRAINER_NEXT = ("make the Trainer distributed: on CPU pass --use_cpu "
                "(TrainingArguments(use_cpu=True), gloo); check that its log says "
                "\"distributed training: True\" on every rank")

#: Steps every rank must have recorded before "no collective" means anything (the first
#: collective of a DDP job is in its first backward; an eval-only warm-up has none).
MIN_STEPS = 20


def not_data_parallel(comm: dict[Any, dict[str, Any] | None]) -> str | None:
    """Why the job is not data-parallel, from each rank's ``doctor_comm`` row: every rank of a
    multi-rank job recorded 0 collectives over at least ``MIN_STEPS`` steps. None when it may
    be (a rank unanswered or unrecorded counts as "may communicate": no guess)."""
    if len(comm) < 2 or any(not row for row in comm.values()):
        return None
    rows = [row for row in comm.values() if row]
    if any(int(num(x.get("collectives")) or 0) for x in rows):
        return None
    fewest = min(int(num(x.get("steps")) or 0) for x in rows)
    if fewest < MIN_STEPS:
        return None
    return (f"not data-parallel: the {len(rows)} ranks never communicate (0 collectives in "
            f"{fewest} steps): each trains its own model")


def docs_not_data_parallel(docs: list[RankDoc]) -> str | None:
    """``not_data_parallel`` over doctor's answers (the ``comm`` evidence of each rank)."""
    return not_data_parallel({d.rank: next(iter(d.rows("comm") or []), None) for d in docs})


def check_isolated(report: Report, docs: list[RankDoc]) -> None:
    if len(docs) < 2:
        return
    answers = {d.rank: d.rows("comm") for d in docs}
    if not all(answers.values()):
        report.unchecked.append(f"ranks communicating: {unrecorded(docs, 'comm')}")
        return
    rows = {r: x[0] for r, x in answers.items() if x}
    colls = {r: int(num(x.get("collectives")) or 0) for r, x in rows.items()}
    steps = {r: int(num(x.get("steps")) or 0) for r, x in rows.items()}
    if any(colls.values()):
        report.fine.append(f"ranks communicate: {min(colls.values())}-{max(colls.values())} "
                           "collectives recorded per rank")
        return
    if min(steps.values()) < MIN_STEPS:
        report.unchecked.append(f"ranks communicating: no collective yet, after "
                                f"{min(steps.values())} steps (judged after {MIN_STEPS})")
        return
    n = len(docs)
    fewest = min(steps.values())
    evidence = [f"rank {r}: 0 collectives in {steps[r]} steps recorded (last step "
                f"{rows[r].get('last_step')})" for r in sorted(rows)]
    evidence += [
        "no all_reduce, broadcast or barrier on any rank, in the explicit calls or in the "
        "Flight Recorder (which records DDP's gradient all-reduces)",
        "each rank trains a model of its own: the job is not data-parallel (GB_tok and the "
        "memory levers assume it is), and a checkpoint saved by rank 0 holds rank 0's model "
        "only",
    ]
    trainer = any(x.get("framework") == "hf_trainer" for x in rows.values())
    if trainer:
        evidence.append("the loop is the HF Trainer, which wraps the model in DDP itself when "
                        "its TrainingArguments say the job is distributed")
    report.findings.append(Finding(
        WARNING, "isolated", f"RANKS NEVER COMMUNICATE: {n} ranks, 0 collectives in {fewest} "
        "steps: each trains its own copy (is the model wrapped in DistributedDataParallel or "
        "FSDP on this device?)", evidence, TRAINER_NEXT if trainer else PLAIN_NEXT,
        sorted(rows), score=0.6))


#: The checks of this module, for doctor.py's registry (checks.py).
CHECKS = (
    DoctorCheck("isolated", 65, lambda report, ctx: check_isolated(report, ctx.docs),
                evidence=(Evidence("comm", "doctor_comm"),)),
)
