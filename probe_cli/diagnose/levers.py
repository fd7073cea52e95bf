"""The precise levers of a slow step: host syncs with their lines, the compile state, host work
inside one module, and many small ops, read from what each rank recorded. Pure: canned-query
rows in, small summaries out; throughput.py picks the lever with them and time_checks-style
checks here add doctor's HOST SYNCS finding.

Thresholds, chosen so that a healthy loop stays quiet (the fault suite's healthy scenarios and
lever_scenarios.py score them):

- ``MANY_SYNCS``: syncs per step (the median step) from which they are named. A loop that logs
  its loss with ``.item()`` once a step, clips or steps an AMP scaler has a handful; a loop
  that converts every element or logs every micro-batch has tens to thousands.
- host work in a module: its own forward time at least ``MODULE_SHARE`` of the median step,
  at most ``MODULE_FLOPS`` of the step's FLOPs, and its ops' host time under ``MODULE_OP_TIME``
  of its forward (on CPU the ops' time is their compute; a module of large elementwise ops has
  no FLOPs but its time is in its ops).
- many small ops: at least ``SMALL_OPS`` aten ops in the measured step and at most
  ``SMALL_OP_US`` microseconds of compute per op (compute time / ops). Before these the
  verdict rested on FLOP/s against the peak alone, and said "small ops" on healthy toy jobs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .checks import Evidence
from .findings import num

MANY_SYNCS = 16
MODULE_SHARE = 0.3
MODULE_FLOPS = 0.01
MODULE_OP_TIME = 0.25
SMALL_OPS = 300
SMALL_OP_US = 60.0
#: Host-sync call sites asked of each rank (the busiest first).
SYNC_SITES = 5
#: Slowest modules asked of each rank (time_checks.TOP_MODULES: one query for both).
TOP_MODULES = 5
#: The canned queries the lever reads beside the throughput row (doctor's evidence, and
#: `probe throughput`'s second asks): key -> query, params from the window.
LEVER_EVIDENCE = (
    Evidence("host_syncs", "host_syncs", lambda last: {"last": last, "limit": SYNC_SITES}),
    Evidence("compile", "compile_state"),
    Evidence("slow", "slow_modules", lambda last: {"last": last, "limit": TOP_MODULES}),
    Evidence("module_flops", "module_flops"),
)
LEVER_KEYS = tuple(e.key for e in LEVER_EVIDENCE)
#: What each kind of sync is called, and what to do about it.
LABEL = {"item": ".item()", "tolist": ".tolist()", "cpu": '.cpu()/.numpy()/.to("cpu")',
         "print": "print/format of a tensor", "data_shape": "data-dependent shape",
         "synchronize": "synchronize"}
ADVICE = {
    "item": "keep the value on the device (total += loss.detach()) and call .item() every N "
            "steps",
    "tolist": "keep the tensor on the device, or convert it every N steps",
    "cpu": "move to the host every N steps, or with non_blocking=True into pinned memory",
    "print": "log every N steps (a printed or formatted tensor waits for the device)",
    "data_shape": "a fixed-size formulation (masking or torch.where with 3 arguments instead of "
                  "nonzero/boolean indexing), or nonzero_static",
    "synchronize": "drop torch.cuda.synchronize from the loop (keep it in timing code only)",
}


@dataclass(slots=True)
class Syncs:
    """One rank's host syncs over the window (the host_syncs query)."""

    per_step: float
    ms_per_step: float
    steps: int
    sites: list[dict[str, Any]] = field(default_factory=list)

    @property
    def many(self) -> bool:
        return self.per_step >= MANY_SYNCS

    def top(self) -> str:
        """``806 .item() per step at train.py:248`` for the busiest site."""
        return site_text(self.sites[0]) if self.sites else f"{self.per_step:g} per step"

    def advice(self) -> str:
        kinds = []
        for s in self.sites:
            if s.get("kind") in ADVICE and s["kind"] not in kinds:
                kinds.append(s["kind"])
        return "; ".join(ADVICE[k] for k in kinds[:2]) or ADVICE["item"]


def site_text(site: dict[str, Any]) -> str:
    n = num(site.get("calls_per_step")) or 0.0
    where = (f"{os.path.basename(str(site['file']))}:{site.get('line')}"
             if site.get("file") else "other sites")
    return f"{n:g} {LABEL.get(str(site.get('kind')), str(site.get('kind')))} per step at {where}"


def syncs_of(rows: list[dict[str, Any]] | None) -> Syncs | None:
    if not rows:
        return None
    first = rows[0]
    sites = [r for r in rows if r.get("kind") is not None]
    return Syncs(per_step=num(first.get("syncs_per_step")) or 0.0,
                 ms_per_step=num(first.get("sync_ms_per_step")) or 0.0,
                 steps=int(num(first.get("steps")) or 0), sites=sites)


@dataclass(slots=True)
class Compiled:
    """One rank's compile state (the compile_state query's row)."""

    row: dict[str, Any]

    @property
    def compiled(self) -> bool:
        r = self.row
        return bool(r.get("compiled_root") or r.get("compiled_modules")
                    or (num(r.get("graphs")) or 0) > 0)

    @property
    def breaks(self) -> int:
        return int(num(self.row.get("graph_breaks")) or 0)

    @property
    def recompiles(self) -> int:
        return int(num(self.row.get("recompiles")) or 0)

    def what(self) -> str:
        r = self.row
        if not self.compiled:
            return "not compiled"
        where = "the root model" if r.get("compiled_root") else (
            f"submodules {r['compiled_modules']}" if r.get("compiled_modules")
            else "compiled functions")
        return (f"{where} compiled: {int(num(r.get('graphs')) or 0)} graphs, "
                f"{self.breaks} graph breaks, {self.recompiles} recompiles")


def compiled_of(rows: list[dict[str, Any]] | None) -> Compiled | None:
    return Compiled(rows[0]) if rows else None


@dataclass(slots=True)
class HostModule:
    """A module whose forward waits on host code: time with no tensor work."""

    module: str
    ms: float  # its own forward time per step
    share: float  # of the median step
    flops_share: float
    op_ms: float


def host_module(slow: list[dict[str, Any]] | None, flops: list[dict[str, Any]] | None,
                step_ms: float | None) -> HostModule | None:
    """The slowest module by its own forward time, when it does almost no tensor work."""
    if not slow or not flops or not step_ms:
        return None
    by_name = {r.get("module"): r for r in flops}
    all_flops = num(flops[0].get("all_flops")) or 0.0
    best = max(slow, key=lambda r: num(r.get("fwd_self_ms")) or 0.0)
    ms = num(best.get("fwd_self_ms")) or 0.0
    share = ms / step_ms
    if share < MODULE_SHARE:
        return None
    own = by_name.get(best.get("module"), {})
    f = num(own.get("flops")) or 0.0
    op_ms = num(own.get("op_ms")) or 0.0
    f_share = f / all_flops if all_flops else 0.0
    if f_share > MODULE_FLOPS or op_ms > MODULE_OP_TIME * ms:
        return None
    return HostModule(str(best.get("module")), ms, share, f_share, op_ms)


def op_size(flops: list[dict[str, Any]] | None) -> int | None:
    """Aten ops of the FLOP-measured step (None: never measured)."""
    if not flops:
        return None
    return int(num(flops[0].get("all_ops")) or 0) or None


@dataclass(slots=True)
class Extras:
    """What the lever reads beside the throughput row, for one rank."""

    syncs: Syncs | None = None
    compiled: Compiled | None = None
    module: HostModule | None = None
    ops: int | None = None


def extras_of(answers: dict[str, list[dict[str, Any]] | None],
              step_ms: float | None) -> Extras:
    """``answers``: the host_syncs, compile_state, slow_modules and module_flops queries' rows
    (keys ``host_syncs``, ``compile``, ``slow``, ``module_flops``)."""
    flops = answers.get("module_flops")
    return Extras(syncs=syncs_of(answers.get("host_syncs")),
                  compiled=compiled_of(answers.get("compile")),
                  module=host_module(answers.get("slow"), flops, step_ms),
                  ops=op_size(flops))


def small_ops(ops: int | None, compute_ms: float) -> tuple[bool, str]:
    """Whether the compute time goes into many small ops, and the numbers that say so."""
    if not ops:
        return False, "ops per step not measured"
    us = compute_ms * 1e3 / ops
    text = f"{ops} ops in the measured step, {us:.0f} us of compute per op"
    return ops >= SMALL_OPS and us <= SMALL_OP_US, text
