"""`probe compare` as text: the verdict first, then the numbers behind it (pure)."""

from __future__ import annotations

import json
from typing import Any

from ..diagnose.compare import Comparison
from ..diagnose.shift import Shift
from .text import format_table

#: Modules listed by default: the largest changes.
MODULE_ROWS = 10
LABELS = {"params_mib": "parameters", "grads_mib": "gradients", "optimizer_mib": "optimizer state",
          "activations_mib": "activations", "other_mib": "other", "total_mib": "total",
          "input_share": "input (DataLoader) wait", "collective_share": "collective wait",
          "host_share": "host (outside modules)", "checkpoint_share": "checkpoint saves",
          "cpu_wait_share": "waiting for a CPU (a busy machine)"}


def compare_json(c: Comparison) -> str:
    return json.dumps(c.to_dict(), default=str)


def render_compare(c: Comparison, limit: int = MODULE_ROWS) -> list[str]:
    lines = [c.headline, f"  A = {c.a} ({_count(c, 'a')})", f"  B = {c.b} ({_count(c, 'b')})", ""]
    rows = [r for r in (_metric("step time", c.step, 1e3, "ms"),
                        _metric("tokens/s", c.tokens_per_s, 1.0, ""),
                        _metric("MFU", c.mfu, 100.0, "%")) if r]
    lines += format_table(["", "A", "B", "B - A", f"{c.confidence:.0%} CI", "relative"], rows)
    if c.modules:
        lines += ["", "Modules, self time per traced step (B - A), largest change first "
                      "(~: the interval includes no change):"]
        mod_rows = [[m.module, m.part, f"{m.shift.median_a * 1e3:.3f}",
                     f"{m.shift.median_b * 1e3:.3f}",
                     f"{m.shift.estimate * 1e3:+.3f}" + ("" if m.shift.excludes_zero else " ~"),
                     _ci(m.shift, 1e3), "" if m.share is None else f"{m.share:.0%}"]
                    for m in c.modules[:limit]]
        lines += format_table(["module", "part", "A ms", "B ms", "B - A ms", "CI ms",
                               "of step change"], mod_rows)
        if len(c.modules) > limit:
            lines.append(f"  ... {len(c.modules) - limit} more (--limit)")
    elif c.counts["a"]["traced_steps"] == 0 or c.counts["b"]["traced_steps"] == 0:
        lines += ["", "Modules: no traced steps in one run (PROBE_TRACE=every:N traces every "
                      "Nth step; off traces none)"]
    changed = [f"  memory, {LABELS.get(k, k)}: {a:.4g} -> {b:.4g} MiB ({_rel(a, b)})"
               for k, a, b in c.memory]
    changed += [f"  {LABELS.get(k, k)}: {a:.0%} -> {b:.0%} of the step" for k, a, b in c.shares]
    changed += [f"  {k}: {_shown(a)} -> {_shown(b)}" for k, a, b in c.settings]
    lines += ["", "Changed elsewhere:", *changed] if changed else ["", "Nothing else changed."]
    return lines


def _count(c: Comparison, side: str) -> str:
    n = c.counts[side]
    return f"{n['ranks']} ranks, {n['steps']} steps, {n['traced_steps']} traced"


def _metric(name: str, s: Shift | None, scale: float, unit: str) -> list[str] | None:
    if s is None:
        return None
    rel = s.relative(s.estimate)
    return [name, f"{s.median_a * scale:.4g} {unit}".strip(), f"{s.median_b * scale:.4g} {unit}"
            .strip(), f"{s.estimate * scale:+.4g}", _ci(s, scale),
            "" if rel is None else f"{rel:+.1%}"]


def _ci(s: Shift, scale: float) -> str:
    if s.low is None or s.high is None:
        return "(too few)"
    return f"{s.low * scale:+.4g} .. {s.high * scale:+.4g}"


def _rel(a: float, b: float) -> str:
    return f"{(b - a) / a:+.0%}" if a else "new"


def _shown(v: Any) -> str:
    return "(none)" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
