"""`probe backtrace --children`: each rank's child processes as text (pure; stdlib only).

    Rank 1 (pid 4242): 2 children, read from outside by its watchdog
      DataLoader worker 0 (pid 4300), state S: waits for work
          get (queues.py:113)
          _worker_loop (worker.py:339)
      DataLoader worker 1 (pid 4301), state S: making a batch
          read_remote_shard (collective_job.py:71)
          __getitem__ (collective_job.py:65)
          ...

A worker's frames under ``_worker_loop`` were copied from the rank at fork and are left out
(diagnose/loader_workers.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from probe_protocol.bodies import BacktraceBody

from ..diagnose.loader_workers import is_idle, is_worker, label, own_frames
from ..result import RankResult
from .stacks import format_frames, thread_header
from .text import paint

NO_CHILDREN_READ = ("children not read: no watchdog answered for this rank (PROBE_WATCHDOG=0, "
                    "or an agent older than `--children`)")


def _doing(child: dict[str, Any]) -> str:
    if not is_worker(child):
        return str(child.get("cmdline") or child.get("name") or "")[:120]
    idle = is_idle(child)
    return "waits for work" if idle else "making a batch" if idle is False else "?"


def render_child(child: dict[str, Any], *, show_locals: bool = False, show_all: bool = False,
                 colour: bool = False) -> list[str]:
    head = f"  {paint(label(child), 'bold', colour)}, state {child.get('state') or '?'}: " \
           f"{_doing(child)}"
    if child.get("error"):
        head += f" [{child['error']}]"
    out = [head]
    threads = [t for t in child.get("threads") or [] if isinstance(t, dict)]
    for t in threads:
        if show_all or len(threads) > 1:
            out.append("    " + thread_header(t, None, colour))
        frames = own_frames({**child, "threads": [{**t, "is_main": True}]})
        out += ["    " + line for line in format_frames(frames, show_locals=show_locals,
                                                          colour=colour)]
        left = len(t.get("frames") or []) - len(frames)
        if left > 0:
            out.append("    " + paint(f"    ({left} frames under _worker_loop: the rank's, copied "
                                      "at fork)", "dim", colour))
    return out


def render_children(results: Sequence[RankResult], *, show_locals: bool = False,
                    show_all: bool = False, colour: bool = False) -> list[str]:
    """Every rank's children, rank by rank (an empty list when no rank answered)."""
    out: list[str] = []
    for r in sorted(results, key=lambda r: (r.rank is None, r.rank or 0)):
        bt = BacktraceBody.from_wire(r.data)
        who = f"Rank {r.rank} (pid {bt.pid})"
        if bt.children is None:
            why = ("children not kept: a post-mortem copy has no child processes"
                   if bt.source == "postmortem" else NO_CHILDREN_READ)
            out += [f"{who}: {why}", ""]
            continue
        n = len(bt.children)
        out.append(paint(f"{who}: {n} child process{'es' if n != 1 else ''}"
                         f"{', read from outside by its watchdog' if n else ''}", "bold", colour))
        for c in bt.children:
            out += render_child(c, show_locals=show_locals, show_all=show_all, colour=colour)
        out.append("")
    return out[:-1]
