"""Where a rank's memory goes, and what would free the most of it. Pure: the rows of the canned
queries memory_breakdown and memory_activations in, a ``Breakdown`` and its ranked ``Lever``s
out (`probe memory`, `probe memory --advice` and doctor's memory-use finding all use these).

Levers, each with its estimate and the numbers it rests on:
- checkpoint the modules whose subtree saves the most beyond their inputs (torch.utils.checkpoint
  keeps a module's inputs and recomputes the rest in backward): subtree saved - inputs;
- halve the micro-batch and double accumulation (same global batch): activations / 2;
- shard the optimizer state across the data-parallel ranks: optimizer x (1 - 1/world), unless
  the parameters are DTensors (FSDP2 shards it already);
- bf16 parameters and gradients: half of the float32 parameters and of their gradients;
- CUDA: expandable_segments when the allocator holds much more than is allocated.
Ranked by bytes saved; levers within ``TIE`` of each other put the one acting on the largest
kind first (Adam on 2 ranks: sharding and bf16 both save one parameter copy; the optimizer is
the cause).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .checks import DoctorCheck, Evidence

#: CUDA: a rank whose peak reaches this share of the device is short of memory (warning).
PRESSURE = 0.9
#: Levers whose estimates are within this share of each other rank by the cause they act on.
TIE = 0.1
#: CUDA: reserved - allocated counts as fragmentation above both of these.
FRAG_MIB, FRAG_SHARE = 256.0, 0.2
#: Levers that would save less than this are not worth a change to the job: not listed.
MIN_LEVER_MIB = 1.0
#: Modules `checkpoint` names at most, and the least a module must save, as a share of the best
#: candidate's savings, to be named beside it (a GPT's identical blocks all qualify).
CHECKPOINT_MODULES, CHECKPOINT_SHARE = 8, 0.5
#: Ranks whose breakdown doctor's finding carries in ``detail`` (the worst first).
DETAIL_RANKS = 128
#: Ranks named one by one in the finding's evidence (the worst; the rest are counted).
EVIDENCE_RANKS = 8
#: Traced steps whose medians make the breakdown; modules listed by saved activations.
BREAKDOWN_STEPS, TOP_ACTIVATIONS = 5, 5
KINDS = ("parameters", "gradients", "optimizer", "activations")


def _f(v: Any) -> float:
    try:
        return float(v) if v is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def mib(v: float) -> str:
    if v >= 1024:
        return f"{v / 1024:.1f} GiB"
    return f"{v:.1f} MiB" if v >= 1 else f"{v * 1024:.0f} KiB"


@dataclass(frozen=True, slots=True)
class Lever:
    lever: str  # checkpoint | micro_batch | shard_optimizer | bf16 | expandable_segments
    saves_mib: float
    basis: str
    action: str
    acts_on: str  # the kind it frees

    def to_json(self) -> dict[str, Any]:
        return {"lever": self.lever, "saves_mib": round(self.saves_mib, 2), "basis": self.basis,
                "action": self.action, "acts_on": self.acts_on}


@dataclass(frozen=True, slots=True)
class Breakdown:
    rank: int
    device: str
    step: int
    kinds: dict[str, float]  # parameters, gradients, optimizer, activations, other
    total: float
    counted_activations: bool
    capacity: float | None
    allocated: float | None
    reserved: float | None
    peak: float | None
    params_fp32: float
    sharded: bool
    top: list[dict[str, Any]] = field(default_factory=list)  # memory_activations, by saved
    by_checkpoint: list[dict[str, Any]] = field(default_factory=list)
    #: exact bytes of parameters, gradients, optimizer, activations (None: not recorded)
    exact: dict[str, int | None] = field(default_factory=dict)
    #: torch.compile compiled frames on the rank: activations cannot be counted there
    compiled: bool = False

    @property
    def uncounted(self) -> str:
        """Why activations were not counted ("" when they were)."""
        if self.counted_activations:
            return ""
        if self.compiled:
            return ("not measurable under torch.compile (the hooks that count saved tensors "
                    "would be traced into its graphs, so they stay off)")
        return "not counted on these steps (the accounting switched itself off: `probe trace` " \
               "shows why)"

    def kinds_text(self, shares: bool = False) -> str:
        """'parameters 10.0 MiB (3%), ..., activations not measurable under torch.compile'."""
        total = self.total or 1.0
        return ", ".join(
            f"{k} not counted" if k == "activations" and not self.counted_activations
            else f"{k} {self._size(k, v)}" + (f" ({100 * v / total:.0f}%)" if shares else "")
            for k, v in self.kinds.items())

    def _size(self, kind: str, v: float) -> str:
        """The exact bytes when the row has them: the MiB columns are rounded to 0.01, so a
        242 KiB model read "246 KiB" (DeepSpeedExamples' CIFAR net)."""
        exact = self.exact.get(kind)
        return mib(exact / 2**20) if exact is not None else mib(v)

    @property
    def cause(self) -> str:
        """The largest of the kinds training controls (on CPU 'other' is mostly the interpreter
        and torch's own libraries, so it is shown, never named as the cause)."""
        return max(KINDS, key=lambda k: self.kinds[k])

    @property
    def pressure(self) -> float | None:
        """Share of the device in use at the peak (CUDA), else None."""
        if not self.capacity:
            return None
        used = max(_f(self.peak), _f(self.reserved), self.total)
        return used / self.capacity

    def to_json(self, world: int) -> dict[str, Any]:
        return {
            "rank": self.rank, "device": self.device, "step": self.step,
            **{f"{k}_mib": round(v, 2) for k, v in self.kinds.items()},
            # not counted is not zero: null, and why
            **({"activations_mib": None, "activations_note": self.uncounted}
               if not self.counted_activations else {}),
            "total_mib": round(self.total, 2), "capacity_mib": self.capacity,
            "used_share": None if self.pressure is None else round(self.pressure, 4),
            "allocated_mib": self.allocated, "reserved_mib": self.reserved,
            "peak_mib": self.peak, "params_fp32_mib": round(self.params_fp32, 2),
            "sharded": self.sharded, "cause": self.cause,
            # machine-readable output carries exact bytes: 0.01 MiB was 3% of a small model
            "bytes": dict(self.exact),
            "top_activations": [{"module": r["module"], "saved_mib": r["saved_mib"],
                                 "share": r["share"], "input_mib": r["input_mib"],
                                 "checkpoint_saves_mib": r["checkpoint_saves_mib"]}
                                for r in self.top],
            "advice": [lv.to_json() for lv in levers(self, world)],
        }


def breakdown(rank: int, row: dict[str, Any], acts: list[dict[str, Any]]) -> Breakdown:
    """One rank's ``memory_breakdown`` row and its ``memory_activations`` rows."""
    mine = [a for a in acts if a.get("rank") == rank or a.get("rank") is None]
    act = row.get("activations_mib")
    return Breakdown(
        rank=rank, device=str(row.get("device")), step=int(_f(row.get("step"))),
        kinds={"parameters": _f(row.get("params_mib")), "gradients": _f(row.get("grads_mib")),
               "optimizer": _f(row.get("optimizer_mib")), "activations": _f(act),
               "other": _f(row.get("other_mib"))},
        total=_f(row.get("total_mib")), counted_activations=act is not None,
        exact={k: (int(row[c]) if row.get(c) is not None else None)
               for k, c in (("parameters", "params_bytes"), ("gradients", "grads_bytes"),
                            ("optimizer", "optimizer_bytes"),
                            ("activations", "activations_bytes"))},
        capacity=row.get("capacity_mib"), allocated=row.get("allocated_mib"),
        reserved=row.get("reserved_mib"), peak=row.get("peak_mib"),
        params_fp32=_f(row.get("params_fp32_mib")), sharded=bool(row.get("sharded")),
        compiled=bool(row.get("compiled")),
        top=sorted((a for a in mine if _f(a.get("by_saved")) <= TOP_ACTIVATIONS
                    and _f(a.get("saved_mib")) > 0), key=lambda a: a["by_saved"]),
        by_checkpoint=sorted((a for a in mine if a.get("by_checkpoint") is not None),
                             key=lambda a: a["by_checkpoint"]))


def _checkpoint(b: Breakdown) -> Lever | None:
    chosen: list[dict[str, Any]] = []
    for r in b.by_checkpoint:
        name = str(r["module"])
        saves = _f(r.get("checkpoint_saves_mib"))
        if _f(r.get("depth")) < 1 or saves <= 0:
            continue
        if chosen and saves < CHECKPOINT_SHARE * _f(chosen[0]["checkpoint_saves_mib"]):
            break
        if any(name.startswith(c["module"] + ".") or c["module"].startswith(name + ".")
               for c in chosen):
            continue  # nested in (or around) one already chosen
        chosen.append(r)
        if len(chosen) == CHECKPOINT_MODULES:
            break
    if not chosen:
        return None
    saves = sum(_f(r["checkpoint_saves_mib"]) for r in chosen)
    basis = "; ".join(f"{r['module']} saves {mib(_f(r['subtree_mib']))} in its forward and "
                      f"would keep its {mib(_f(r['input_mib']))} of inputs" for r in chosen)
    names = ", ".join(r["module"] for r in chosen)
    return Lever("checkpoint", saves, basis,
                 f"wrap {names} in torch.utils.checkpoint.checkpoint(..., use_reentrant=False)"
                 " (costs one more forward of them in backward)", "activations")


def levers(b: Breakdown, world: int) -> list[Lever]:
    """What would free memory on this rank, most bytes first (see the module docstring)."""
    out: list[Lever] = []
    act, opt = b.kinds["activations"], b.kinds["optimizer"]
    if b.counted_activations and act > 0:
        ck = _checkpoint(b)
        if ck is not None:
            out.append(ck)
        out.append(Lever("micro_batch", act / 2,
                         f"activations {mib(act)} per forward pass scale with the micro-batch",
                         "halve the micro-batch and double gradient accumulation (same global "
                         "batch)", "activations"))
    if opt > 0 and world > 1 and not b.sharded:
        out.append(Lever("shard_optimizer", opt * (1 - 1 / world),
                         f"optimizer state {mib(opt)} held whole on each of {world} "
                         "data-parallel ranks",
                         "shard it across the ranks: FSDP2 fully_shard, or "
                         "torch.distributed.optim.ZeroRedundancyOptimizer", "optimizer"))
    p, g = b.kinds["parameters"], b.kinds["gradients"]
    if b.params_fp32 > 0 and p > 0:
        g32 = g * b.params_fp32 / p
        out.append(Lever("bf16", (b.params_fp32 + g32) / 2,
                         f"float32 parameters {mib(b.params_fp32)} and their gradients "
                         f"{mib(g32)} take half in bf16 (with no float32 master copy kept)",
                         "keep parameters and gradients in bf16 (FSDP2: MixedPrecisionPolicy("
                         "param_dtype=torch.bfloat16)); or autocast to cut activations",
                         "parameters"))
    if b.device.startswith("cuda") and b.reserved is not None and b.allocated is not None:
        frag = _f(b.reserved) - _f(b.allocated)
        if frag >= FRAG_MIB and frag >= FRAG_SHARE * _f(b.reserved):
            out.append(Lever("expandable_segments", frag,
                             f"the allocator reserves {mib(_f(b.reserved))} for "
                             f"{mib(_f(b.allocated))} allocated: {mib(frag)} cached in blocks "
                             "it cannot reuse for other sizes",
                             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "other"))
    rank_of = {k: i for i, k in enumerate(sorted(b.kinds, key=lambda k: -b.kinds[k]))}

    def key(lv: Lever) -> tuple[float, int]:
        return (lv.saves_mib, -rank_of.get(lv.acts_on, 9))

    out.sort(key=key, reverse=True)
    # within TIE of the one above: the lever acting on the larger kind goes first
    for i in range(1, len(out)):
        a, c = out[i - 1], out[i]
        if (a.saves_mib - c.saves_mib <= TIE * a.saves_mib
                and rank_of.get(c.acts_on, 9) < rank_of.get(a.acts_on, 9)):
            out[i - 1], out[i] = c, a
    return [lv for lv in out if lv.saves_mib >= MIN_LEVER_MIB]


def cause_line(b: Breakdown) -> str:
    """'activations are the largest kind (51% of 12.0 MiB): attn saves 30% of them'."""
    total = sum(b.kinds[k] for k in KINDS) or 1.0
    cause = b.cause
    line = f"{cause} are the largest kind ({100 * b.kinds[cause] / total:.0f}% of " \
           f"{mib(total)} of tensors)" if cause != "optimizer" else \
           f"optimizer state is the largest kind ({100 * b.kinds[cause] / total:.0f}% of " \
           f"{mib(total)} of tensors)"
    if cause == "activations" and b.top:
        t = b.top[0]
        line += f": {t['module']} saves {100 * _f(t['share']):.0f}% of them"
    return line


def check_memory_use(report: Any, docs: list[Any]) -> None:
    """Doctor's memory-use finding: the breakdown of the rank closest to its limit, the cause and
    the levers ranked by bytes saved. A warning only when a CUDA rank's peak reaches
    ``PRESSURE`` of its device; otherwise info (a CPU job has no device to fill)."""
    from .findings import INFO, WARNING, Finding

    rows = [(d, r) for d in docs for r in (d.breakdown or [])]
    if not rows:
        if any(d.breakdown is None for d in docs):
            return  # an older agent: not recorded
        report.unchecked.append("memory use: no traced step counted yet (memory by kind is "
                                "taken on traced steps; `probe trace every 10` for one in 10)")
        return
    from .isolated import docs_not_data_parallel

    # ranks that never communicate each hold a model of their own: nothing to shard across
    alone = docs_not_data_parallel(docs)
    world = 1 if alone else len(docs)
    bds = [breakdown(d.rank, r, d.activations or []) for d, r in rows]
    worst = max(bds, key=lambda b: (b.pressure or 0.0, b.total))
    lv = levers(worst, world)
    pressed = [b for b in bds if (b.pressure or 0.0) >= PRESSURE]
    evidence = []
    shown = sorted(sorted(bds, key=lambda b: (-(b.pressure or 0.0), -b.total))[:EVIDENCE_RANKS],
                   key=lambda b: b.rank)
    for b in shown:
        parts = b.kinds_text()
        cap = f" of {mib(_f(b.capacity))} ({100 * (b.pressure or 0):.0f}% at the peak)" \
            if b.capacity else ""
        evidence.append(f"rank {b.rank} {b.device} step {b.step}: {parts}; total "
                        f"{mib(b.total)}{cap}")
    if len(bds) > len(shown):
        evidence.append(f"... {len(bds) - len(shown)} more ranks (`probe memory` lists all)")
    evidence.append(cause_line(worst))
    if not worst.counted_activations:
        evidence.append(f"activations {worst.uncounted}")
    evidence += [f"lever: {x.lever} saves ~{mib(x.saves_mib)} ({x.basis})" for x in lv]
    if alone:
        evidence.append(f"no optimizer sharding lever: {alone}")
    first = f"; first lever: {lv[0].lever} (-{mib(lv[0].saves_mib)})" if lv else ""
    if pressed:
        title = (f"MEMORY PRESSURE: rank {worst.rank} {worst.device} at "
                 f"{100 * (worst.pressure or 0):.0f}% of {mib(_f(worst.capacity))}: "
                 f"{cause_line(worst)}{first}")
        sev, score = WARNING, 100.0 * (worst.pressure or 0)
    else:
        title = f"memory use: {cause_line(worst)}{first}"
        sev, score = INFO, 0.0
    report.findings.append(Finding(
        sev, "memory_use", title, evidence, "probe memory --advice",
        sorted({b.rank for b in (pressed or [worst])}), score=score,
        detail={"cause": worst.cause, "levers": [x.to_json() for x in lv],
                # the ranks closest to their limit first; bounded, so a report of a large job
                # stays small (the dashboard draws these as bars)
                "breakdown": [b.to_json(world) for b in sorted(
                    bds, key=lambda b: (-(b.pressure or 0.0), -b.total))[:DETAIL_RANKS]],
                "ranks_counted": len(bds)}))


#: The check of this module, for doctor.py's registry (checks.py).
CHECKS = (
    DoctorCheck("memory_use", 50, lambda report, ctx: check_memory_use(report, ctx.docs),
                evidence=(Evidence("breakdown", "memory_breakdown",
                                   lambda _: {"last": BREAKDOWN_STEPS}),
                          Evidence("activations", "memory_activations",
                                   lambda _: {"top": TOP_ACTIVATIONS}))),
)
