"""Why one rank is slower than the others, when the data says so: more samples or tokens per
step, a longer sequence, more DataLoader wait, more host syncs than the median of the other
ranks (the rank_work query's row per rank), or, with expert parallelism, more of the MoE tokens
to compute: it holds the experts every rank's router favours (``held_tokens``, from each
rank's python.moe_load rows and their ``owner``). Pure. The straggler verdict appends these reasons
to its headline; none is given unless the difference is large (``RATIO`` x the others' median,
and an absolute floor), so a jittery healthy job gets no made-up cause.
"""

from __future__ import annotations

import statistics
from typing import Any

from .findings import num

#: The slow rank's figure at least this many times the others' median is a reason.
RATIO = 1.3
#: (column, what it is, unit, absolute difference below which it is no reason)
MEASURES = (
    ("samples", "its batch is {x:.1f}x the others' ({a:g} vs {b:g} samples per step)", 1.0),
    ("tokens", "it gets {x:.1f}x the others' tokens per step ({a:g} vs {b:g})", 1.0),
    ("context_len", "its sequences are {x:.1f}x longer ({a:g} vs {b:g} tokens)", 1.0),
    ("data_wait_ms", "it waits {x:.1f}x longer for the DataLoader ({a:.1f} vs {b:.1f} ms per "
                     "step)", 2.0),
    ("syncs_per_step", "it makes {x:.1f}x the others' host syncs ({a:g} vs {b:g} per step)",
     8.0),
    ("moe_tokens", "it holds the busy experts: it computes {x:.1f}x the others' MoE tokens "
                   "({a:g} vs {b:g} over the sampled steps)", 1.0),
)


def held_tokens(rows: list[dict[str, Any]]) -> dict[int, int]:
    """Expert parallelism: the MoE tokens each rank computes, i.e. those every rank's router
    sent to the experts it holds (``owner``), summed over layers. Empty without EP."""
    out: dict[int, int] = {}
    for r in rows:
        owner = num(r.get("owner"))
        if owner is not None:
            out[int(owner)] = out.get(int(owner), 0) + int(num(r.get("tokens")) or 0)
    return out if len(out) > 1 else {}


def why_slower(rank: Any, work: dict[Any, dict[str, Any]]) -> list[str]:
    """The reasons ``rank`` does more work per step than the others, largest first."""
    mine = work.get(rank)
    others = [w for r, w in work.items() if r != rank]
    if not mine or not others:
        return []
    out = []
    for col, text, floor in MEASURES:
        a = num(mine.get(col))
        vals = [v for w in others if (v := num(w.get(col))) is not None]
        if a is None or not vals:
            continue
        b = statistics.median(vals)
        if a - b < floor:
            continue
        x = a / b if b > 0 else float("inf")
        if x >= RATIO:
            out.append((x, text.format(x=x, a=a, b=b) if b > 0 else
                        text.split(" (")[0].format(x=x) + f" ({a:g} vs none)"))
    # ...and the same batch counted twice (tokens follow samples): keep the larger ratio first
    return [t for _, t in sorted(out, key=lambda p: -p[0])]
