"""The run dir: where an agent's unix socket and discovery files live (issue 20). Stdlib only.

``choose(path)`` makes sure the agent comes up even when its run dir cannot be used: full, out
of inodes, read-only, a symlink, or made first by another uid (any local user can create
``/tmp/probe-<uid>`` for every uid). It then falls back, in order, to ``$XDG_RUNTIME_DIR/probe``
and to a fresh private ``/tmp/probe-<uid>-XXXXXX``, and says why in one line. It never uses a
directory that is not ours. `probe ps` and `probe PID` look in the same places
(probe_cli/transport/local_dirs.py keeps the CLI's copy of the list: the two share no code).

``sweep(path)`` removes the files of dead processes (bounded; at start-up and `probe ps --clean`):
a pid is dead when no process has it, or when the process that has it now started after the
files were written (a reused pid). A dead rank whose watchdog still runs keeps its files: the
watchdog reports the death from them.
"""

from __future__ import annotations

import os
import socket
import stat
import tempfile

#: At most this many names are looked at by one sweep (a run dir of 1240 files was seen).
SWEEP_MAX = 5000


def problem(path: str) -> str | None:
    """Why ``path`` cannot be this uid's run dir (made 0700 if missing), or None."""
    try:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            # exist_ok: the ranks of one job start together and race to make it (seen in CI).
            os.makedirs(path, mode=0o700, exist_ok=True)
            st = os.lstat(path)
    except OSError as e:
        return f"{path}: {e.strerror}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory (a symlink or a file)"
    if st.st_uid != os.getuid():
        return f"{path} belongs to uid {st.st_uid}, not to us (uid {os.getuid()})"
    try:
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(path, 0o700)
        # A socket and a file must fit: a full or read-only filesystem fails here, not later.
        probe = os.path.join(path, f".probe-{os.getpid()}-{os.urandom(3).hex()}.check")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(probe)
        os.unlink(probe)
    except OSError as e:
        return f"{path}: {e.strerror}"
    return None


def fallbacks() -> list[str]:
    """Where a run dir may be, after the configured one (the CLI looks in the same places)."""
    out = []
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        out.append(os.path.join(xdg, "probe"))
    return out


def choose(path: str) -> tuple[str, str | None]:
    """The run dir to use, and a warning when it is not ``path``."""
    why = problem(path)
    if why is None:
        return path, None
    for cand in fallbacks():
        if problem(cand) is None:
            return cand, f"run dir {why}; using {cand} instead"
    # mkdtemp makes it 0700 and ours, with a name nobody could have taken first.
    cand = tempfile.mkdtemp(prefix=f"probe-{os.getuid()}-", dir="/tmp")
    return cand, f"run dir {why}; using {cand} instead (`probe ps` looks there)"


def _start_time(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds), or None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _zombie(pid: int) -> bool:
    """A killed process nobody has reaped yet still answers kill(pid, 0); its files are dead.
    (A SIGKILLed rank's watchdog is reparented and reaped only later.)"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def _pid_alive(pid: int, written: float) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another uid's process has it: not ours, but alive
    if _zombie(pid):
        return False
    started = _start_time(pid)
    return started is None or started <= written + 1.0


def sweep(path: str, keep: int | None = None) -> list[str]:
    """Remove the files of dead processes in ``path``; the names removed. ``keep``: a pid
    never to touch (the caller's own)."""
    try:
        names = sorted(os.listdir(path))[:SWEEP_MAX]
    except OSError:
        return []
    by_pid: dict[int, list[str]] = {}
    for name in names:
        stem = name.split(".", 1)[0]
        if stem.isdigit() and "." in name:
            by_pid.setdefault(int(stem), []).append(name)
    removed: list[str] = []
    for pid, files in by_pid.items():
        if pid == keep:
            continue
        try:
            written = max(os.lstat(os.path.join(path, n)).st_mtime for n in files)
        except OSError:
            continue
        if _pid_alive(pid, written) or _watchdog_alive(path, pid):
            continue
        for n in files:
            try:
                os.unlink(os.path.join(path, n))
                removed.append(n)
            except OSError:
                pass
    return removed


def _watchdog_alive(path: str, pid: int) -> bool:
    import json

    try:
        with open(os.path.join(path, f"{pid}.watchdog.json")) as f:
            rec = json.load(f)
        wpid = int(rec["watchdog_pid"])
        written = os.stat(os.path.join(path, f"{pid}.watchdog.json")).st_mtime
    except (OSError, ValueError, KeyError, TypeError):
        return False
    # the watchdog writes its record after it starts (and again when its rank dies)
    return _pid_alive(wpid, written)
