"""Old post-mortem directories go: by age, then by size, oldest job first (at agent start)."""

from __future__ import annotations

import os
import shutil
import stat
import time

from probe_protocol import postmortem as layout

#: A job's copy older than this (its newest file) is removed.
MAX_AGE_S = 7 * 24 * 3600.0
#: All jobs' copies together past this: the oldest jobs go until they fit.
MAX_TOTAL_BYTES = 4 * 1024**3


def _newest(path: str) -> float:
    newest = 0.0
    for base, _, files in os.walk(path):
        for name in files:
            try:
                newest = max(newest, os.lstat(os.path.join(base, name)).st_mtime)
            except OSError:
                pass
    return newest


def sweep(root: str, keep: str, now: float | None = None, max_age_s: float = MAX_AGE_S,
          max_total: int = MAX_TOTAL_BYTES) -> list[str]:
    """Remove job directories under ``root`` past ``max_age_s``, then the oldest until all fit
    ``max_total`` bytes; never ``keep`` (this job) nor another uid's. Returns what went."""
    now = time.time() if now is None else now
    try:
        names = os.listdir(root)
    except OSError:
        return []
    jobs = []
    for name in names:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if name == keep or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        jobs.append((_newest(path) or st.st_mtime, layout.dir_bytes(path), path))
    jobs.sort()
    removed = []
    total = sum(size for _, size, _ in jobs)
    for newest, size, path in jobs:
        if now - newest > max_age_s or total > max_total:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            total -= size
    return removed
