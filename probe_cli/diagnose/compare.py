"""`probe compare`'s verdict: run B against run A, the step time first, then what explains it.

Pure: two ``RunEvidence`` (gather/runs.py) in, a ``Comparison`` out. Every change is B - A.

- **Step time** decides: a change is found when the whole interval of its Hodges-Lehmann shift
  (diagnose/shift.py) lies at least ``threshold`` of A's median away from no change, in one
  direction. So two runs of one config on a noisy machine stay quiet unless they really differ
  by that much, and a regression is named only when it is at least that large at the stated
  confidence (the estimate alone never decides).
- **Modules**: each module's forward and backward self time per traced step, shifted the same
  way; largest change first, with the share of the step-time change each explains. The
  culprit is the largest one that moved the same way as the step and whose interval excludes
  no change.
- **Everything else** is listed only where it changed: tokens/s and MFU, memory by kind, where
  the step goes (input wait, collectives, host), the LR schedule, the batch, and what the job
  runs (world size, micro-batches, context, dtype, versions, command line).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..result import RankResult
from .shift import Shift, shift
from .verdict import Verdict

#: Memory kinds compared (memory_breakdown's columns), in the order people read them.
MEMORY_KINDS = ("params_mib", "grads_mib", "optimizer_mib", "activations_mib", "other_mib",
                "total_mib")
#: Where a step goes (throughput's shares): the ones a change in the data or the network moves.
SHARES = ("input_share", "collective_share", "host_share", "checkpoint_share", "cpu_wait_share")


@dataclass
class RunEvidence:
    """One target, job-wide. ``failed``: the ranks that did not answer (compare says so)."""

    label: str
    ranks: list[int] = field(default_factory=list)
    failed: list[RankResult] = field(default_factory=list)
    step_s: dict[int, float] = field(default_factory=dict)
    tokens_per_s: dict[int, float] = field(default_factory=dict)
    mfu: list[float] = field(default_factory=list)
    #: (module, part) -> step -> self seconds (mean over the ranks that traced that step)
    modules: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)
    traced_steps: int = 0
    memory: dict[str, float] = field(default_factory=dict)
    shares: dict[str, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.step_s)


#: A memory kind changed when it moved this fraction of A's value and at least MEMORY_MIB.
MEMORY_FRACTION, MEMORY_MIB = 0.05, 1.0
#: A share of the step (input wait, collectives...) changed when it moved this many points.
SHARE_POINTS = 0.05


@dataclass(frozen=True, slots=True)
class ModuleChange:
    module: str
    part: str
    shift: Shift
    share: float | None
    """The fraction of the step-time change this module's change is (None: no step change)."""

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module, "part": self.part, **_shift_json(self.shift, 1e3),
                "share_of_step_change": self.share}


@dataclass(slots=True)
class Comparison(Verdict):
    a: str = ""
    b: str = ""
    threshold: float = 0.05
    confidence: float = 0.95
    step: Shift | None = None
    tokens_per_s: Shift | None = None
    mfu: Shift | None = None
    modules: list[ModuleChange] = field(default_factory=list)
    memory: list[tuple[str, float, float]] = field(default_factory=list)
    shares: list[tuple[str, float, float]] = field(default_factory=list)
    settings: list[tuple[str, Any, Any]] = field(default_factory=list)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            **Verdict.to_json(self),
            "a": self.a, "b": self.b, "threshold": self.threshold,
            "confidence": self.confidence, "counts": self.counts,
            "step_ms": _shift_json(self.step, 1e3) if self.step else None,
            "tokens_per_s": _shift_json(self.tokens_per_s) if self.tokens_per_s else None,
            "mfu": _shift_json(self.mfu) if self.mfu else None,
            "modules": [m.to_json() for m in self.modules],
            "memory_mib": [{"kind": k, "a": a, "b": b} for k, a, b in self.memory],
            "shares": [{"share": k, "a": a, "b": b} for k, a, b in self.shares],
            "settings": [{"setting": k, "a": a, "b": b} for k, a, b in self.settings],
        }


def _shift_json(s: Shift, scale: float = 1.0) -> dict[str, Any]:
    def sc(v: float | None) -> float | None:
        return None if v is None else v * scale

    return {"a": sc(s.median_a), "b": sc(s.median_b), "change": sc(s.estimate),
            "low": sc(s.low), "high": sc(s.high), "relative": s.relative(s.estimate),
            "relative_low": s.relative(s.low), "relative_high": s.relative(s.high),
            "n_a": s.n_a, "n_b": s.n_b, "excludes_zero": s.excludes_zero}


def compare_runs(a: RunEvidence, b: RunEvidence, *, threshold: float = 0.05,
                 confidence: float = 0.95, slower_only: bool = False) -> Comparison:
    """B against A. ``threshold``: the fraction of A's step time a change must surely exceed;
    ``slower_only``: a faster B is reported, not found (a CI gate on regressions)."""
    out = Comparison(problem=False, headline="", a=a.label, b=b.label, threshold=threshold,
                     confidence=confidence)
    out.counts = {side: {"ranks": len(r.ranks), "steps": r.steps,
                         "traced_steps": r.traced_steps}
                  for side, r in (("a", a), ("b", b))}
    out.step = _paired_shift(a.step_s, b.step_s, confidence)
    out.tokens_per_s = _paired_shift(a.tokens_per_s, b.tokens_per_s, confidence)
    out.mfu = shift(a.mfu, b.mfu, confidence) if a.mfu and b.mfu else None
    out.modules = _module_changes(a, b, out.step, confidence)
    out.memory = [(k, a.memory[k], b.memory[k]) for k in MEMORY_KINDS
                  if k in a.memory and k in b.memory and _memory_changed(a.memory[k],
                                                                          b.memory[k])]
    out.shares = [(k, a.shares[k], b.shares[k]) for k in SHARES
                  if k in a.shares and k in b.shares
                  and abs(b.shares[k] - a.shares[k]) >= SHARE_POINTS]
    keys = sorted(set(a.settings) | set(b.settings))
    out.settings = [(k, a.settings.get(k), b.settings.get(k)) for k in keys
                    if _shown(a.settings.get(k)) != _shown(b.settings.get(k))]
    _decide(out, slower_only)
    return out


def _paired_shift(a: dict[int, float], b: dict[int, float], confidence: float) -> Shift | None:
    return shift([a[s] for s in sorted(a)], [b[s] for s in sorted(b)], confidence)


def _module_changes(a: RunEvidence, b: RunEvidence, step: Shift | None,
                    confidence: float) -> list[ModuleChange]:
    changes = []
    for key in set(a.modules) | set(b.modules):
        sa, sb = a.modules.get(key), b.modules.get(key)
        # a module only one run has: the other run's traced steps count 0 for it
        va = [sa[s] for s in sorted(sa)] if sa else [0.0] * a.traced_steps
        vb = [sb[s] for s in sorted(sb)] if sb else [0.0] * b.traced_steps
        s = shift(va, vb, confidence)
        if s is None:
            continue
        share = s.estimate / step.estimate if step is not None and step.estimate else None
        changes.append(ModuleChange(key[0], key[1], s, share))
    return sorted(changes, key=lambda m: (-abs(m.shift.estimate), m.module, m.part))


def _memory_changed(a: float, b: float) -> bool:
    return abs(b - a) >= MEMORY_MIB and abs(b - a) >= MEMORY_FRACTION * max(abs(a), 1e-9)


def _shown(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def _decide(out: Comparison, slower_only: bool) -> None:
    s = out.step
    if s is None or s.low is None:
        n = (s.n_a, s.n_b) if s else (out.counts["a"]["steps"], out.counts["b"]["steps"])
        out.headline = (f"no verdict: too few steps to compare ({n[0]} in A, {n[1]} in B; "
                        "at least 5 each): let both runs take more steps, or pass --last")
        return
    rel, lo, hi = s.relative(s.estimate), s.relative(s.low), s.relative(s.high)
    assert rel is not None and lo is not None and hi is not None
    ms = f"{s.median_b * 1e3:.4g} ms against {s.median_a * 1e3:.4g} ms"
    ci = f"{out.confidence:.0%} CI {lo:+.1%} .. {hi:+.1%}"
    if not s.beyond(out.threshold):
        out.headline = (f"no change beyond {out.threshold:.0%}: B's step time {rel:+.1%} "
                        f"against A's ({ms}; {ci})")
        return
    out.problem = rel > 0 or not slower_only
    word = "REGRESSION: B's step is" if rel > 0 else "IMPROVEMENT: B's step is"
    slower = "slower" if rel > 0 else "faster"
    out.headline = (f"{word} {abs(rel):.1%} {slower} than A's ({ms}; {ci}, beyond the "
                    f"{out.threshold:.0%} threshold)")
    culprit = next((m for m in out.modules if m.shift.excludes_zero
                    and (m.shift.estimate > 0) == (s.estimate > 0)), None)
    if culprit is not None:
        share = f", {culprit.share:.0%} of the change" if culprit.share is not None else ""
        out.headline += (f"; first: {culprit.module} {culprit.part} "
                         f"{culprit.shift.estimate * 1e3:+.3g} ms self time per step{share}")
    busy = next(((va, vb) for k, va, vb in out.shares if k == "cpu_wait_share"), None)
    if busy is not None:  # runnable but not running: the machine, not the job, was slower
        out.headline += (f" (but A waited for a CPU {busy[0]:.0%} of its step and B {busy[1]:.0%}"
                         ": a machine busier in one run, not the code, may explain part of it)")
    out.details = [f"{k}: {_shown(va)} -> {_shown(vb)}" for k, va, vb in out.settings]
