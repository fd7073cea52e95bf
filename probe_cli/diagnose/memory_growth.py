"""`probe doctor`'s memory growth check: a leak (steady growth over a long window of steps,
warm-up left out) and CUDA OOMs, per rank and device, from the ``memory_growth`` canned query.
Pure; see time_checks.py for the shape of a check.
"""

from __future__ import annotations

from typing import Any

from ..group import rank_label
from .checks import DoctorCheck, Evidence
from .findings import CRITICAL, WARNING, Finding, RankDoc, Report, num, unrecorded

#: Steps each rank recorded first that the memory check leaves out (or the first quarter of
#: what it recorded, when longer; memory_growth.sql): optimizer state, caches and the
#: allocator's arenas grow there, and would read as a leak in a young job (`probe memory`
#: leaves out the same by default).
MEMORY_WARMUP_STEPS = 10
#: The memory check looks at this many steps (after warm-up): a long window, because over 50
#: steps a healthy job's RSS wanders by tens of MiB (measured: 418.7 -> 456.4 MiB over 50 steps,
#: flat at 440-459 MiB over 1,800).
MEMORY_WINDOW_STEPS = 1000
#: Steps needed in the window before growth can be judged at all.
MEMORY_MIN_STEPS = 60
#: On CPU (the job's RSS) growth under FAST_GROWTH_MIB is judged only over this many steps: the
#: agent's own serving lands in the job's heap (its Python objects and pymalloc's arenas are not
#: in agent_mib), and a healthy ZeRO-3 job probed hard on a loaded machine (eval, pause, lr,
#: checkpoint, traced `probe slow` queries, doctor) grew +31 MiB over steps 37-145, 262 KiB a
#: step and 3/3 quarters rising: the planted leak's slope. The planted leak is judged over
#: ~190 steps (step 250); CUDA allocated has no agent share and keeps MEMORY_MIN_STEPS.
CPU_MIN_STEPS = 150
#: ... unless it adds up to this much: the documented leak, 1.8 MiB a step, is named over 75.
FAST_GROWTH_MIB = 96.0
#: Memory growth is a finding only when it adds up to this many MiB over the window (robust
#: slope x steps), and this fraction of the start ...
GROWTH_MIB = 24.0
GROWTH_FRACTION = 0.03
#: ... at a robust slope of at least this many MiB per step (a healthy 2-rank job, measured by
#: bench/verdicts.py: ~35 KiB/step at step 300 after its first quarter is left out; the leak
#: the suite plants: 256 KiB) ...
MIN_SLOPE_MIB = 3 / 32
#: ... and keeps up: the second half's slope at least this share of the whole window's, and
#: the medians of the window's 4 quarters rising one after the other (warm-up flattens out;
#: allocator noise goes up and down; a leak does neither).
LATE_SHARE = 0.5
#: CUDA: warn when fewer than this many steps of growth are left before the device is full.
OOM_STEPS = 1000


def _memory_line(d: RankDoc, row: dict[str, Any]) -> tuple[str, float, str]:
    """One rank/device's evidence line, its robust slope and its verdict: 'leak', 'fine', or
    'early' (it grows like a leak, over too few steps to tell from the agent's own serving)."""
    dev = row.get("device") or "?"
    first, last = num(row.get("mem_first_mib")), num(row.get("mem_last_mib"))
    slope = num(row.get("mem_mib_per_step")) or 0.0
    late = num(row.get("late_mib_per_step"))
    rising = int(num(row.get("rising_quarters")) or 0)
    steps = int(num(row.get("steps")) or 0)
    span = (num(row.get("last_step")) or 0) - (num(row.get("first_step")) or 0)
    grown = slope * span
    line = (f"rank {d.rank} {dev}: {row.get('measure')} {first:.1f} -> {last:.1f} MiB over steps "
            f"{row.get('first_step')}-{row.get('last_step')}, robust slope {slope:+.3f} MiB/step "
            f"({grown:+.1f} MiB), second half {late if late is not None else 0:+.3f}, "
            f"{rising}/3 quarters rising")
    a0, a1 = num(row.get("agent_first_mib")), num(row.get("agent_last_mib"))
    if a0 is not None and a1 is not None:
        line += f"; the agent's own (DuckDB, Arrow) {a0:.1f} -> {a1:.1f} MiB, left out"
    free = num(row.get("heap_free_mib"))
    if free is not None and str(dev).startswith("cpu"):
        line += f"; malloc's free heap ({free:.1f} MiB at the end), left out"
    near_oom = False
    total = num(((d.state or {}).get("cuda_total_mib") or {}).get(dev))
    reserved = num(row.get("reserved_mib"))
    if dev.startswith("cuda") and total and reserved is not None:
        left = total - reserved
        line += f"; headroom {left:.0f} of {total:.0f} MiB"
        if slope > 0:
            line += f", full in ~{left / slope:.0f} steps at this rate"
            near_oom = left / slope < OOM_STEPS
    sustained = (late is not None and late >= LATE_SHARE * slope and rising == 3)
    big = grown >= GROWTH_MIB and grown >= GROWTH_FRACTION * max(first or 0.0, 1.0)
    leak = steps >= MEMORY_MIN_STEPS and sustained and (
        (big and slope >= MIN_SLOPE_MIB) or (near_oom and slope > 0))
    if leak and not dev.startswith("cuda") and steps < CPU_MIN_STEPS and grown < FAST_GROWTH_MIB:
        return line, slope, "early"
    return line, slope, "leak" if leak else "fine"


def check_memory(report: Report, docs: list[RankDoc]) -> None:
    have = [d for d in docs if d.memory]
    if not have:
        report.unchecked.append(f"memory: python.memory has no rows ({unrecorded(docs, 'memory')})"
                                if any(d.memory is None for d in docs) else
                                f"memory: no steps past the first {MEMORY_WARMUP_STEPS} yet "
                                "(warm-up is left out)")
        return
    grows: list[tuple[int, float, str]] = []  # (rank, slope MiB/step, evidence line)
    fine: list[tuple[int, float, str]] = []
    ooms: list[str] = []
    young: list[int] = []
    early: list[str] = []
    for d in have:
        for row in d.memory or []:
            dev = row.get("device") or "?"
            if int(num(row.get("ooms")) or 0) > 0:
                ooms.append(f"rank {d.rank} {dev}: {int(num(row['ooms']) or 0)} CUDA OOMs, "
                            f"{int(num(row.get('alloc_retries')) or 0)} allocator retries")
            if num(row.get("mem_first_mib")) is None or num(row.get("mem_last_mib")) is None:
                continue
            if int(num(row.get("steps")) or 0) < MEMORY_MIN_STEPS:
                young.append(d.rank)
                continue
            line, slope, verdict = _memory_line(d, row)
            if verdict == "early":
                early.append(line)
            else:
                (grows if verdict == "leak" else fine).append((d.rank, slope, line))
    if ooms:
        report.findings.append(Finding(
            CRITICAL, "oom", "CUDA OOM: the allocator ran out of memory", ooms,
            'probe query "SELECT step, device, allocated, reserved, peak, ooms FROM '
            'python.memory ORDER BY step DESC LIMIT 10"', score=1e7))
    if grows:
        ranks = sorted({r for r, _, _ in grows})
        top = max(s for _, s, _ in grows)
        report.findings.append(Finding(
            WARNING, "memory",
            f"MEMORY GROWTH: {rank_label(ranks)} {_verb(ranks, 'grows', 'grow')} "
            f"{_size(top)} every step, steadily",
            [line for _, _, line in grows] + [
                "something keeps tensors alive across steps: a list of losses or outputs "
                "(append loss.item(), not loss), a cache, or a growing batch",
                "first lever: find the holder: `probe memory --tensors` twice, some steps "
                "apart; the group whose count grows names its list or attribute"],
            "probe memory --tensors", ranks, score=top))
    elif early:
        report.unchecked.append(
            f"memory: growth under {FAST_GROWTH_MIB:.0f} MiB is judged over {CPU_MIN_STEPS} "
            "steps past warm-up (the agent's own requests land in the job's RSS); so far "
            + early[0])
    elif fine:
        report.fine.append("memory: no sustained growth; " + fine[0][2])
    elif young:
        report.unchecked.append(f"memory: fewer than {MEMORY_MIN_STEPS} steps past warm-up yet")


def _size(mib: float) -> str:
    return f"{mib:.1f} MiB" if mib >= 1 else f"{mib * 1024:.0f} KiB"


def _verb(ranks: Any, one: str, many: str) -> str:
    return one if len(set(ranks)) == 1 else many



#: The check of this module, for doctor.py's registry (checks.py).
CHECKS = (
    DoctorCheck("memory", 40, lambda report, ctx: check_memory(report, ctx.docs),
                evidence=(Evidence("memory", "memory_growth", lambda _: {
                    "last": MEMORY_WINDOW_STEPS, "warmup": MEMORY_WARMUP_STEPS}),)),
)
