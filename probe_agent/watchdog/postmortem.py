"""The watchdog's part of the post-mortem copy: the death, written where the copy is.

The rank leaves the path of its post-mortem directory in ``<pid>.postmortem``
(probe_agent/postmortem/). When the rank dies the watchdog, which sees its exit status, either
removes the directory (a clean exit, unless PROBE_POSTMORTEM=always) or writes ``death.json``:
the exit (code, signal, uncaught exception), the last step and the last stacks (faulthandler's
at a fatal signal or SIGTERM, else the last snapshot). That is the only record of a SIGKILL or
of the process group's SIGABRT, where nothing ran in the rank.
"""

from __future__ import annotations

import os
import time
from typing import Any

from probe_protocol import owned_tree
from probe_protocol import postmortem as layout
from probe_protocol.runfiles import RunFiles


def _clean(exit_: dict[str, Any], end: dict[str, Any]) -> bool:
    if exit_.get("signal") or exit_.get("exception") or end.get("kind", "exit") != "exit":
        return False
    # The status is unknown when the rank's parent reaped it first: its own account decides.
    return exit_.get("code") == 0 or (exit_.get("code") is None and end.get("kind") == "exit")


def record_death(files: RunFiles, rank: Any, keep: bool) -> None:
    """``rank``: the watchdog's RankWatch (exit, died_at, last_step, last_backtrace)."""
    try:
        with open(os.open(files.postmortem, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                          | os.O_CLOEXEC)) as f:
            path = f.read(4096).strip()
    except OSError:
        return
    if not path or not owned_tree.is_rank_copy(path):
        return  # only a copy proven ours (the pointer is a file in the run dir)
    exit_ = dict(rank.exit or {})
    end = layout.read_json(os.path.join(path, layout.END))
    try:
        if _clean(exit_, end) and not keep:
            owned_tree.remove_rank_copy(path)
        else:
            bt = rank.last_backtrace or {}
            layout.write_json(os.path.join(path, layout.DEATH), {
                "at": rank.died_at or time.time(), "pid": rank.pid, "exit": exit_,
                "last_step": rank.last_step, "backtrace": {
                    "taken_at": bt.get("taken_at"), "route": bt.get("route"),
                    "threads": bt.get("threads") or []}})
    except OSError:
        pass
    try:
        os.unlink(files.postmortem)
    except OSError:
        pass
