"""How much one sample of timings moved against another, robustly, with an interval.

``shift(a, b)`` is the Hodges-Lehmann estimate of the shift from ``a`` to ``b``: the median of
every pairwise difference ``b[j] - a[i]``. A few disturbed steps (a probe command on a busy
node, a checkpoint) move it by little, unlike a difference of means. Its interval is the
distribution-free one that goes with it (the Mann-Whitney order statistics of the sorted
differences, normal approximation), so it holds for skewed step times as for clean ones.

It assumes the steps of each run are exchangeable, which a drifting run is not; compare reads
both runs over the same kind of window (their last N steps) for that reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist, median

#: Fewer values than this on either side: no interval (the estimate alone is shown).
MIN_SAMPLES = 5
#: Longest sample used, newest values kept: 500 x 500 differences sort in ~0.1 s.
MAX_SAMPLES = 500


@dataclass(frozen=True, slots=True)
class Shift:
    """``b`` against ``a``: ``estimate`` (b - a, the units of the samples), its interval
    ``low``..``high`` at ``confidence`` (None with too few values), the medians of both."""

    estimate: float
    low: float | None
    high: float | None
    median_a: float
    median_b: float
    n_a: int
    n_b: int
    confidence: float

    def relative(self, value: float | None) -> float | None:
        """``value`` as a fraction of ``a``'s median (None when that is 0 or value is)."""
        if value is None or not self.median_a:
            return None
        return value / self.median_a

    @property
    def excludes_zero(self) -> bool:
        """The interval lies wholly on one side of no change."""
        return self.low is not None and self.high is not None and (
            self.low > 0 or self.high < 0)

    def beyond(self, fraction: float) -> bool:
        """The whole interval is at least ``fraction`` of a's median away from no change, in
        one direction: the change is that large at the stated confidence."""
        lo, hi = self.relative(self.low), self.relative(self.high)
        if lo is None or hi is None:
            return False
        return lo >= fraction or hi <= -fraction


def shift(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Shift | None:
    """The Hodges-Lehmann shift of ``b`` against ``a`` (None when either is empty)."""
    a = [float(x) for x in a if x is not None and math.isfinite(x)][-MAX_SAMPLES:]
    b = [float(x) for x in b if x is not None and math.isfinite(x)][-MAX_SAMPLES:]
    if not a or not b:
        return None
    diffs = sorted(y - x for x in a for y in b)
    estimate = median(diffs)
    low = high = None
    n, m = len(a), len(b)
    if n >= MIN_SAMPLES and m >= MIN_SAMPLES:
        z = NormalDist().inv_cdf(0.5 + confidence / 2)
        k = math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12))
        k = max(0, min(k, len(diffs) - 1))
        low, high = diffs[k], diffs[len(diffs) - 1 - k]
    return Shift(estimate, low, high, median(a), median(b), n, m, confidence)
