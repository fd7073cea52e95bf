"""doctor's unused-parameter check (pure): which parameters get no gradient, by module and rank,
and what that means for DDP's ``find_unused_parameters`` (python.unused_params, recorded on
traced steps and the first steps of a multi-rank job; collectors/unused_params.py).

- Some parameters got no gradient and DDP's flag is off (or unknown in a DDP job): critical.
  DDP waits for their buckets forever; the next iteration fails with "Expected to have finished
  reduction in the prior iteration" (torch names indices; this names the modules). Either
  use them in the loss or pass ``find_unused_parameters=True``.
- Some got none and the flag is on: info, "needed" (the set is non-empty, or changes between
  steps); the finding lists them by module.
- None ever went unused over the recorded steps and the flag is on: info, "costs time": DDP
  walks the autograd graph after every forward for nothing (``detail.verdict``).
"""

from __future__ import annotations

from typing import Any

from .checks import Context, DoctorCheck, Evidence
from .findings import CRITICAL, INFO, Finding, Report

KEY = "unused_params"
#: Recorded steps with every parameter used before "only costs time" is said.
MIN_CLEAN_STEPS = 3

#: The HF Trainer makes the DDP wrapper itself, with find_unused_parameters=True by default for a
#: model without activation checkpointing: the knob is its argument, not a DDP keyword.
TRAINER_NEXT = ("pass --ddp_find_unused_parameters False (TrainingArguments("
                "ddp_find_unused_parameters=False); DDP then skips its graph walk after every "
                "forward)")


def _hf_trainer(ctx: Context) -> bool:
    """The loop is the HF Trainer (doctor_comm's framework, read for the isolated check)."""
    return any(x.get("framework") == "hf_trainer" for d in ctx.docs for x in d.rows("comm") or [])


def check_unused_params(report: Report, ctx: Context) -> None:
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for d in ctx.docs:
        rows = d.rows(KEY)
        if rows:
            by_rank[d.rank] = rows
    if not by_rank:
        return  # nothing recorded (no traced step, a single process): no line at all
    unused = {r: [x for x in rows if x.get("module") is not None] for r, rows in by_rank.items()}
    flag = any(bool(x.get("find_unused")) for rows in by_rank.values() for x in rows)
    known = any(x.get("find_unused") is not None for rows in by_rank.values() for x in rows)
    recorded = max(int(x.get("steps_recorded") or 0) for rows in by_rank.values() for x in rows)
    ranks = sorted(r for r, rows in unused.items() if rows)
    if ranks:
        modules: dict[str, dict[str, Any]] = {}
        for r in ranks:
            for x in unused[r]:
                m = modules.setdefault(x["module"] or "<root>", {"params": x["params"],
                                                                 "ranks": [], "steps": 0,
                                                                 "first": x["first_unused"]})
                m["ranks"].append(r)
                m["steps"] = max(m["steps"], int(x.get("steps_unused") or 0))
        names = ", ".join(sorted(modules))
        evidence = [f"module {m}: {v['params']} got no gradient on {v['steps']} of {recorded} "
                    f"recorded steps (first at step {v['first']}) on rank"
                    f"{'s' if len(v['ranks']) > 1 else ''} {','.join(map(str, v['ranks']))}"
                    for m, v in sorted(modules.items())]
        varies = any(0 < v["steps"] < recorded for v in modules.values())
        if flag:
            report.findings.append(Finding(
                INFO, "unused_params", f"find_unused_parameters=True is needed: {names} "
                f"{'get' if len(modules) > 1 else 'gets'} no gradient"
                + (" on some steps" if varies else ""), evidence,
                "keep find_unused_parameters=True, or make the loss reach these parameters "
                "(then turn it off: it costs a graph walk every step)", ranks,
                detail={"verdict": "needed", "modules": sorted(modules)}))
            return
        sev = CRITICAL if known else INFO
        title = (f"DDP: {names} {'get' if len(modules) > 1 else 'gets'} no gradient and "
                 "find_unused_parameters is off: DDP fails with 'Expected to have finished "
                 "reduction in the prior iteration'" if known else
                 f"parameters of {names} get no gradient")
        report.findings.append(Finding(
            sev, "unused_params", title, evidence,
            "use them in the loss, or pass find_unused_parameters=True to "
            "DistributedDataParallel", ranks, score=2e8,
            detail={"verdict": "crash" if known else "unused", "modules": sorted(modules)}))
        return
    if flag and recorded >= MIN_CLEAN_STEPS:
        report.findings.append(Finding(
            INFO, "unused_params", "find_unused_parameters=True only costs time: every "
            f"parameter got a gradient on all {recorded} recorded steps",
            [f"ranks {','.join(map(str, sorted(by_rank)))}: no unused parameter on {recorded} "
             "recorded steps (traced steps and the first steps)"],
            TRAINER_NEXT if _hf_trainer(ctx) else "pass find_unused_parameters=False (DDP then "
            "skips its graph walk after every forward)", sorted(by_rank),
            detail={"verdict": "costs_time"}))
        return
    report.fine.append(f"unused parameters: none on {recorded} recorded steps")


CHECKS = (DoctorCheck("unused_params", 95, check_unused_params,
                      evidence=(Evidence(KEY, "unused_params"),)),)
