"""Which DataLoader worker a rank waits for, from its children's stacks (pure; no I/O).

The children come from the rank's watchdog (``GET /v1/backtrace?children=1``: pid, name, kind,
worker_id, threads read from outside with py-spy). A worker's main thread is either idle, in
``_worker_loop``'s ``index_queue.get`` waiting for the next indices, or busy making a batch
(``fetch`` -> the dataset's ``__getitem__``). A rank whose main thread has waited for a batch
longer than the verdict's threshold waits for a busy worker; when exactly one is busy it is the
one, and the place it is stuck at is its innermost frame of the user's code (else its innermost
frame). One snapshot cannot tell a stuck worker from a slow one: the verdicts that call this
already know the rank has waited too long.

The frames under ``_worker_loop`` are the rank's own, copied at fork: they are not shown.
"""

from __future__ import annotations

import os
from typing import Any

WORKER_LOOP = "_worker_loop"
_QUEUE_FILE = os.sep + os.path.join("multiprocessing", "queues.py")
_LIBRARY = (os.sep + "site-packages" + os.sep, os.sep + "lib" + os.sep + "python")


def _main_frames(child: dict[str, Any]) -> list[dict[str, Any]]:
    threads = [t for t in child.get("threads") or [] if isinstance(t, dict)]
    main = next((t for t in threads if t.get("is_main")), threads[0] if threads else None)
    frames = [f for f in (main or {}).get("frames") or [] if isinstance(f, dict)]
    return sorted(frames, key=lambda f: int(f.get("depth") or 0))


def own_frames(child: dict[str, Any]) -> list[dict[str, Any]]:
    """The child's main-thread frames, innermost first, up to ``_worker_loop`` (the frames
    outside it were inherited from the rank at fork)."""
    frames = _main_frames(child)
    for i, f in enumerate(frames):
        if f.get("func") == WORKER_LOOP:
            return frames[: i + 1]
    return frames


def is_worker(child: dict[str, Any]) -> bool:
    return child.get("kind") == "dataloader_worker"


def is_idle(child: dict[str, Any]) -> bool | None:
    """True: the worker waits for work (``index_queue.get`` right inside ``_worker_loop``);
    False: it is making a batch; None: its Python stack is unknown."""
    frames = own_frames(child)
    if not frames or frames[-1].get("func") != WORKER_LOOP or child.get("route") == "proc":
        return None
    if len(frames) < 2:
        return None
    inner = frames[-2]
    return inner.get("func") == "get" and str(inner.get("file") or "").endswith(_QUEUE_FILE)


def _frame(f: dict[str, Any]) -> str:
    return f"{f.get('func')} ({os.path.basename(str(f.get('file')))}:{f.get('lineno')})"


def stuck_frame(child: dict[str, Any]) -> dict[str, Any] | None:
    """Where a busy child is: its innermost frame of the user's code, else its innermost."""
    frames = own_frames(child)
    user = [f for f in frames if not any(p in str(f.get("file")) for p in _LIBRARY)]
    return user[0] if user else (frames[0] if frames else None)


def label(child: dict[str, Any]) -> str:
    """``DataLoader worker 1 (pid 4301)``, or ``child process pid 77 (name)``."""
    if is_worker(child):
        wid = child.get("worker_id")
        return f"DataLoader worker {wid if wid is not None else '?'} (pid {child.get('pid')})"
    return f"child process pid {child.get('pid')} ({child.get('name') or '?'})"


def worker_lines(child: dict[str, Any], limit: int = 4) -> list[str]:
    """A child's own frames worth showing (innermost ``limit``, and its user frame)."""
    frames = own_frames(child)
    shown = frames[:limit]
    at = stuck_frame(child)
    if at is not None and at not in shown:
        shown = [*frames[: limit - 1], at]
    return [_frame(f) for f in shown]


def loader_place(children: tuple[dict[str, Any], ...] | list[dict[str, Any]]
                 ) -> tuple[str, list[str]] | None:
    """For a rank waiting for a batch: a phrase naming the worker(s) it waits for and the lines
    that show them (each worker's stack), or None when no DataLoader worker was read."""
    workers = [c for c in children if isinstance(c, dict) and is_worker(c)]
    if not workers:
        return None
    busy = [w for w in workers if is_idle(w) is False]
    unread = [w for w in workers if is_idle(w) is None]
    lines: list[str] = []
    for w in busy:
        lines.append(f"{label(w)}, state {w.get('state') or '?'}, is making a batch:")
        lines += [f"    {x}" for x in worker_lines(w)]
    for w in unread:
        lines.append(f"{label(w)}: no Python stack ({w.get('error') or 'not read'})")
    idle = [w for w in workers if is_idle(w)]
    if idle:
        lines.append(f"{', '.join(label(w) for w in idle)}: "
                     f"{'waits' if len(idle) == 1 else 'wait'} for work (index_queue.get)")
    if len(busy) == 1:
        at = stuck_frame(busy[0])
        where = f", stuck in {_frame(at)}" if at is not None else ""
        return f"in the DataLoader, waiting for a batch from {label(busy[0])}{where}", lines
    if busy:
        ids = ", ".join(str(w.get("worker_id")) for w in busy)
        return (f"in the DataLoader, waiting for a batch; DataLoader workers {ids} are each "
                "making one (see below)"), lines
    if unread:
        return ("in the DataLoader, waiting for a batch; the workers' stacks could not be "
                "read"), lines
    return (f"in the DataLoader, waiting for a batch, while its {len(workers)} "
            f"worker{'s' if len(workers) != 1 else ''} "
            f"{'waits' if len(workers) == 1 else 'wait'} for work"), lines
