"""Helpers for the commands that look at this machine (inject, ps): the run dir and the files
of processes that are gone. The "does this socket's agent answer" check is
transport/local_socket.py. Stdlib only."""

from __future__ import annotations

import json
import os

import click


def run_dir_of(ctx: click.Context) -> str | None:
    """``--run-dir`` of the `probe` group, if given."""
    root = ctx.find_root()
    return root.params.get("run_dir") if root.params else None


def _started_after(pid: int, when: float) -> bool:
    """True when process ``pid`` started after ``when`` (its pid was reused since)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return False
    return boot + ticks / os.sysconf("SC_CLK_TCK") > when + 1.0


def dead_files(run_dir: str) -> list[str]:
    """Paths in ``run_dir`` that belong to processes that are gone: neither the pid nor its
    watchdog (``<pid>.watchdog.json``) runs, or the pid now belongs to a newer process. The
    agent clears the same at start-up (probe_agent/rundir.py)."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return []
    groups: dict[int, list[str]] = {}
    for n in names:
        head = n.split(".", 1)[0]
        if head.isdigit() and "." in n:
            groups.setdefault(int(head), []).append(os.path.join(run_dir, n))
    out = []
    for pid, paths in groups.items():
        try:
            newest = max(os.lstat(p).st_mtime for p in paths)
        except OSError:
            continue
        owners = [pid]
        rec = os.path.join(run_dir, f"{pid}.watchdog.json")
        try:
            with open(rec) as f:
                owners.append(int(json.load(f)["watchdog_pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if not any(_runs(p) and not _started_after(p, newest) for p in owners):
            out += paths
    return out


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed process not reaped yet (a SIGKILLed rank's orphaned watchdog) still answers
    # kill(pid, 0): a zombie's files are dead all the same.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True
