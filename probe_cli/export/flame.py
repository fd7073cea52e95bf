"""Pure data for `probe flame`'s files and tables: merged folded stacks, speedscope JSON,
the widest frames, and the frames where one rank spends far more time than the others (the text
is render/flame.py's). Stdlib only.

Input: each rank's folded stacks, ``"thread;outer;...;inner" -> samples`` (the agent's sampler,
probe_agent/collectors/sampler.py). Shares are per rank (samples with the frame on the stack /
the rank's samples), so ranks that took different numbers of samples compare fairly.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

Folded = Mapping[str, int]

#: A frame is a rank difference when that rank's share is at least this many percentage points
#: above the median of the ranks' shares, and at least DIFF_RATIO times it.
DIFF_POINTS = 10.0
DIFF_RATIO = 1.5


def merge_folded(per_rank: Mapping[int, Folded]) -> dict[str, int]:
    """One folded map of every rank, each stack under a ``rank N`` root frame."""
    out: dict[str, int] = {}
    for rank in sorted(per_rank):
        for stack, n in per_rank[rank].items():
            key = f"rank {rank};{stack}"
            out[key] = out.get(key, 0) + n
    return out


def folded_lines(folded: Folded) -> list[str]:
    """Brendan Gregg's folded format (flamegraph.pl, speedscope and inferno read it)."""
    return [f"{stack} {n}" for stack, n in sorted(folded.items())]


def frame_shares(folded: Folded) -> tuple[dict[str, float], dict[str, float], int]:
    """Per frame label: inclusive share and self share (percent of all samples); the total."""
    total = sum(folded.values())
    incl: dict[str, int] = {}
    self_: dict[str, int] = {}
    for stack, n in folded.items():
        frames = stack.split(";")[1:]  # the first is the thread
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
        if frames:
            self_[frames[-1]] = self_.get(frames[-1], 0) + n
    if not total:
        return {}, {}, 0
    return ({f: 100.0 * n / total for f, n in incl.items()},
            {f: 100.0 * n / total for f, n in self_.items()}, total)


def widest_frames(per_rank: Mapping[int, Folded], top: int = 15) -> list[dict[str, Any]]:
    """The frames with the largest median share across ranks, with each rank's share."""
    shares = {r: frame_shares(f) for r, f in per_rank.items()}
    labels = {label for incl, _, _ in shares.values() for label in incl}
    rows: list[dict[str, Any]] = []
    for label in labels:
        incl = {r: s[0].get(label, 0.0) for r, s in shares.items()}
        self_ = {r: s[1].get(label, 0.0) for r, s in shares.items()}
        rows.append({"frame": label, "median_pct": statistics.median(incl.values()),
                     "self_pct": statistics.median(self_.values()), "ranks": incl})
    rows.sort(key=lambda r: (-r["median_pct"], r["self_pct"], r["frame"]))  # callers first
    return rows[:top]


def hottest_frames(per_rank: Mapping[int, Folded], top: int = 10) -> list[dict[str, Any]]:
    """The frames with the most self time (median share across ranks)."""
    shares = {r: frame_shares(f)[1] for r, f in per_rank.items()}
    labels = {label for s in shares.values() for label in s}
    rows: list[dict[str, Any]] = [{"frame": label, "self_pct": statistics.median(s.get(label, 0.0)
                                                           for s in shares.values()),
             "ranks": {r: s.get(label, 0.0) for r, s in shares.items()}} for label in labels]
    rows.sort(key=lambda r: (-r["self_pct"], r["frame"]))
    return rows[:top]


def rank_differences(per_rank: Mapping[int, Folded]) -> list[dict[str, Any]]:
    """Frames where one rank's share is far above the median of all ranks' (DIFF_POINTS and
    DIFF_RATIO), largest gap first; only the outermost such frame of a chain is kept."""
    if len(per_rank) < 2:
        return []
    shares = {r: frame_shares(f)[0] for r, f in per_rank.items()}
    labels = {label for s in shares.values() for label in s}
    found: list[dict[str, Any]] = []
    for label in labels:
        values = {r: s.get(label, 0.0) for r, s in shares.items()}
        med = statistics.median(values.values())
        for r, v in values.items():
            if v - med >= DIFF_POINTS and v >= DIFF_RATIO * med:
                found.append({"frame": label, "rank": r, "pct": v, "median_pct": med})
    found.sort(key=lambda d: (-(d["pct"] - d["median_pct"]), d["frame"]))
    return found[:15]


def to_speedscope(per_rank: Mapping[int, Folded], name: str) -> dict[str, Any]:
    """A speedscope file (https://www.speedscope.app/file-format-schema.json): one sampled
    profile per rank, sharing one frame table."""
    frames: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    profiles = []
    for rank in sorted(per_rank):
        samples, weights = [], []
        for stack, n in sorted(per_rank[rank].items()):
            ids = []
            for label in stack.split(";"):
                i = index.get(label)
                if i is None:
                    i = index[label] = len(frames)
                    frames.append(_speedscope_frame(label))
                ids.append(i)
            samples.append(ids)
            weights.append(n)
        profiles.append({"type": "sampled", "name": f"rank {rank}", "unit": "none",
                         "startValue": 0, "endValue": sum(weights), "samples": samples,
                         "weights": weights})
    return {"$schema": "https://www.speedscope.app/file-format-schema.json",
            "shared": {"frames": frames}, "profiles": profiles, "name": name,
            "activeProfileIndex": 0, "exporter": "probe flame"}


def _speedscope_frame(label: str) -> dict[str, Any]:
    # label: "qualname (dir/file.py:line)" from the sampler; a thread root has no location.
    if label.endswith(")") and " (" in label:
        name, loc = label[:-1].rsplit(" (", 1)
        file, _, line = loc.rpartition(":")
        if line.isdigit():
            return {"name": name, "file": file, "line": int(line)}
    return {"name": label}


def flame_tables(per_rank: Mapping[int, Folded]) -> dict[str, Any]:
    """What `probe flame` shows as text (render/flame.py): the widest and hottest frames with
    each rank's share, and the rank differences with the rule that found them."""
    return {"ranks": sorted(per_rank), "widest": widest_frames(per_rank),
            "hottest": hottest_frames(per_rank), "differences": rank_differences(per_rank),
            "diff_points": DIFF_POINTS, "diff_ratio": DIFF_RATIO}
