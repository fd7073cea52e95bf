"""`probe memory --snapshot [--for N] -o snap.pickle`: the CUDA allocator's history over the next
N steps of every rank, one pickle per rank that pytorch.org/memory_viz opens."""

from __future__ import annotations

import os

from ..outcome import Outcome, finish
from ..output_files import output_file, refuse_existing
from ..result import RankResult
from ..transport.fanout import RankTarget, fan_out, resolve_ranks
from ..transport.rank_client import RankClient, live
from ..transport.session import Session


def rank_path(dest: str, rank: int | None, many: bool) -> str:
    """``snap.pickle`` -> ``snap.rank3.pickle`` when several ranks answer."""
    if not many:
        return dest
    stem, ext = os.path.splitext(dest)
    return f"{stem}.rank{rank if rank is not None else 'X'}{ext or '.pickle'}"


def snapshot_outcome(session: Session, steps: int, dest: str, overwrite: bool) -> Outcome:
    """Each rank's pickle written as every ``-o`` is (output_files.py): never through a
    planted symlink, never over an existing file without ``--overwrite`` (checked before the
    steps are waited for)."""
    targets = resolve_ranks(session)
    many = len(targets) > 1
    wait = max(60.0, 10.0 * steps)
    for target in targets:
        refuse_existing(rank_path(dest, target.rank, many), overwrite)

    def call(client: RankClient, target: RankTarget) -> dict[str, object]:
        got = live(client, "memory_snapshot").memory_snapshot(steps, wait=wait)
        path = rank_path(dest, target.rank, many)
        with output_file(path, "wb", overwrite=overwrite) as f:
            f.write(got.pop("content"))
        return {**got, "path": path}

    results = fan_out(session, targets, call)
    return finish(session, results, _render)


def _render(ok: list[RankResult]) -> list[str]:
    lines = []
    for r in ok:
        d = r.data or {}
        lines.append(f"rank {r.rank}: {d.get('path')} ({d.get('bytes')} bytes, steps "
                     f"{d.get('steps')}): open it at https://pytorch.org/memory_viz")
    return lines
