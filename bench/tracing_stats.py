"""The statistics and clocks bench_tracing.py's arms measure with: bootstrap intervals, the
least-squares fit of randomised steps (with detrending and winsorizing), the cost of a mode
change, and per-thread CPU and RSS readings.

Pure functions of numbers (or of this process's threads), apart from the arms that produce the
numbers, so that the method can be read, and reused by other benches, on its own.
"""

from __future__ import annotations

import os
import statistics
import time


def bootstrap_median_ci(xs: list[float], n: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of the median (seeded: the report is reproducible)."""
    import random

    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n)]


def thread_cpu_s(prefix: str) -> float:
    """CPU seconds used so far by this process's threads whose name starts with ``prefix``
    (per-thread CPU clocks: nanoseconds, where /proc's ticks are 10 ms)."""
    import threading

    total = 0.0
    for t in threading.enumerate():
        if t.name.startswith(prefix) and t.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, ProcessLookupError):
                pass  # the thread just ended
    return total


def _ols(y: list[float], xs: list[list[int]]) -> list[float]:
    """Least squares y = k + sum(b_j * xs[j]): the coefficients b_j (normal equations on the
    centred data, Gaussian elimination)."""
    n, k = len(y), len(xs)
    my = sum(y) / n
    mx = [sum(x) / n for x in xs]
    cx = [[v - m for v in x] for x, m in zip(xs, mx)]
    a = [[sum(p * q for p, q in zip(cx[i], cx[j])) for j in range(k)]
         + [sum(p * (v - my) for p, v in zip(cx[i], y))] for i in range(k)]
    for c in range(k):
        piv = max(range(c, k), key=lambda r: abs(a[r][c]))
        a[c], a[piv] = a[piv], a[c]
        for r in range(k):
            if r != c and a[c][c]:
                f = a[r][c] / a[c][c]
                a[r] = [u - f * w for u, w in zip(a[r], a[c])]
    return [a[i][k] / a[i][i] if a[i][i] else 0.0 for i in range(k)]


def _detrend(y: list[float], k: int = 10) -> list[float]:
    """y minus its centred moving median over 2k+1 steps: the machine's slow swings (±20%
    over seconds on this VM) leave, step-to-step differences stay."""
    out = []
    for i in range(len(y)):
        w = sorted(y[max(0, i - k):i + k + 1])
        out.append(y[i] - w[len(w) // 2])
    return out


def _winsorized(d: list[float], k: float = 4.0) -> tuple[list[float], float]:
    """``d`` clipped to median ± k robust standard deviations (1.4826 MAD), and the upper bound.
    A step the machine stalled (a neighbour, a page-fault storm, the writer's resolve burst)
    lands on a random kind; clipped, it stops widening every interval, while a shift of the
    whole distribution (a cost) passes through almost whole."""
    s = sorted(d)
    med = s[len(s) // 2]
    mad = sorted(abs(v - med) for v in d)[len(d) // 2] * 1.4826
    lo, hi = med - k * mad, med + k * mad
    return [min(max(v, lo), hi) for v in d], hi


def fit_effects(y: list[float], x: list[int], kinds: int, reps: int = 1000,
             block: int = 25, robust: bool = False,
             skip: frozenset[int] = frozenset()) -> list[dict[str, object]]:
    """For each traced kind 1..kinds (0 = untraced): the cost of a step of that kind on itself
    (``direct``) and on the step after it (``carry``: work it leaves behind), by least squares
    over randomly assigned steps, with a 95% moving-block bootstrap interval of their sum.
    A mode change (``nn.Module.__call__`` reassigned) costs every kind alike, so it cancels out
    of the totals. ``robust``: on the winsorized steps (``_winsorized``); each kind's share of
    clipped-high steps is reported, so a cost that only shows as rare long steps stays visible."""
    import random

    d = _detrend(y)[1:]
    cur, prev = x[1:], x[:-1]
    if skip:  # steps left out of the fit (the FLOP meter's measured step: not a traced step's cost)
        keep = [i for i in range(len(d)) if i + 1 not in skip]
        d, cur, prev = [d[i] for i in keep], [cur[i] for i in keep], [prev[i] for i in keep]
    clipped_high = [0] * (kinds + 1)
    if robust:
        raw = d
        d, hi = _winsorized(d)
        for v, k in zip(raw, cur):
            clipped_high[k] += v > hi

    def fit(idx: list[int]) -> list[float]:
        cols = [[1 if s[i] == k else 0 for i in idx] for k in range(1, kinds + 1)
                for s in (cur, prev)]
        return _ols([d[i] for i in idx], cols)

    n = len(d)
    coef = fit(list(range(n)))
    rng = random.Random(0)
    sums: list[list[float]] = [[] for _ in range(kinds)]
    for _ in range(reps):
        idx: list[int] = []
        while len(idx) < n:
            s0 = rng.randrange(0, n - block)
            idx.extend(range(s0, s0 + block))
        c = fit(idx[:n])
        for k in range(kinds):
            sums[k].append(c[2 * k] + c[2 * k + 1])
    out = []
    for k in range(kinds):
        sums[k].sort()
        ci = (sums[k][int(0.025 * reps)], sums[k][int(0.975 * reps)]) if reps else None
        out.append({"direct": coef[2 * k], "carry": coef[2 * k + 1],
                    "total": coef[2 * k] + coef[2 * k + 1], "ci95": ci,
                    "clipped_high": [clipped_high[0], clipped_high[k + 1]]})
    return out


def toggle_cost(y: list[float], x: list[int], skip: frozenset[int] = frozenset()) -> float:
    """The cost of a mode change (installing or removing the wrapper reassigns
    ``nn.Module.__call__``), from the cell means of traced/untraced pairs:
    (E[1,0] + E[0,1] - E[1,1] - E[0,0]) / 2, any path counting as traced."""
    d = _detrend(y)[1:]
    cells: dict[tuple[bool, bool], list[float]] = {}
    for i, (v, a, b) in enumerate(zip(d, x[1:], x[:-1])):
        if i + 1 not in skip:
            cells.setdefault((bool(a), bool(b)), []).append(v)
    if len(cells) < 4:
        return 0.0
    m = {k: statistics.fmean(v) for k, v in cells.items()}
    return (m[True, False] + m[False, True] - m[True, True] - m[False, False]) / 2


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
