"""Old post-mortem copies go: by age, then by size, oldest job first (at agent start).

Only job directories proven to be this uid's copies (probe_protocol/owned_tree.py: our marker,
our layout, nothing else, no link) are considered, under a root reached without following
anyone else's link; their size is what they take on disk. Anything else under the root, the
owner's own files included, is never touched.
"""

from __future__ import annotations

import os
import time

from probe_protocol import owned_tree

#: A job's copy older than this (its newest file) is removed.
MAX_AGE_S = 7 * 24 * 3600.0
#: All jobs' copies together past this: the oldest jobs go until they fit.
MAX_TOTAL_BYTES = 4 * 1024**3


def sweep(root: str, keep: str, now: float | None = None, max_age_s: float = MAX_AGE_S,
          max_total: int = MAX_TOTAL_BYTES) -> list[str]:
    """Remove proven copies under ``root`` past ``max_age_s``, then the oldest until all fit
    ``max_total`` bytes (allocated); never ``keep`` (this job). Returns what went. Raises
    ``owned_tree.UntrustedPathError`` for a root someone else could change."""
    now = time.time() if now is None else now
    try:
        root_fd = owned_tree.open_root(root)
    except FileNotFoundError:
        return []
    try:
        proofs = []
        for name in os.listdir(root_fd)[:owned_tree.MAX_NAMES]:
            if name != keep:
                proof = owned_tree.prove_job(root_fd, name)
                if proof is not None:
                    proofs.append(proof)
        proofs.sort(key=lambda p: p.newest)
        removed = []
        total = sum(p.allocated for p in proofs)
        for proof in proofs:
            if now - proof.newest > max_age_s or total > max_total:
                if owned_tree.remove_job(root_fd, proof):
                    removed.append(os.path.join(root, proof.name))
                    total -= proof.allocated
        return removed
    finally:
        os.close(root_fd)
