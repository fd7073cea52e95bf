"""The run dir: where an agent's unix socket and discovery files live. Stdlib only.

``choose(path)`` makes sure the agent comes up even when its run dir cannot be used: full, out
of inodes, read-only, a symlink, or made first by another uid (any local user can create
``/tmp/probe-<uid>`` for every uid). It then falls back, in order, to ``$XDG_RUNTIME_DIR/probe``
and to a fresh private ``/tmp/probe-<uid>-XXXXXX``, and says why in one line. It never uses a
directory that is not ours. `probe ps` and `probe PID` look in the same places
(both take the list from probe_protocol/runfiles.py).

``sweep(path)`` removes the files of dead processes at start-up, by the rule that `probe ps
--clean` uses too (probe_protocol/runfiles.py, ``dead_files``).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile

from probe_protocol import runfiles


def write_record(path: str, record: dict) -> int:
    """Write ``record`` as JSON to ``path`` atomically, readable by the owner only (what
    `probe ps` and `probe PID` read); returns the file's inode, so that only our own file is
    removed later. Raises OSError."""
    tmp = path + ".tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)
    return os.stat(path).st_ino


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
    return runfiles.fallback_dirs()


def choose(path: str) -> tuple[str, str | None]:
    """The run dir to use, and a warning when it is not ``path``."""
    why = problem(path)
    if why is None:
        return path, None
    for cand in fallbacks():
        if problem(cand) is None:
            return cand, f"run dir {why}; using {cand} instead"
    # mkdtemp makes it 0700 and ours, with a name nobody could have taken first.
    cand = tempfile.mkdtemp(prefix=runfiles.private_prefix(), dir="/tmp")
    return cand, f"run dir {why}; using {cand} instead (`probe ps` looks there)"


def sweep(path: str, keep: int | None = None) -> list[str]:
    """Remove the files of dead processes in ``path`` (probe_protocol.runfiles.dead_files);
    the names removed. ``keep``: a pid never to touch (the caller's own)."""
    removed: list[str] = []
    for f in runfiles.dead_files(path, keep=keep):
        try:
            os.unlink(f)
            removed.append(os.path.basename(f))
        except OSError:
            pass
    return removed
