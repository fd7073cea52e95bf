"""The post-mortem directory: the on-disk copy of a rank's tables that outlives the rank.

Layout (written by the agent and its watchdog, read by `probe postmortem` and `probe -t DIR`)::

    <root>/<job>/rank-<r>/          0700, every file 0600
        meta.json                   who wrote it, when it was last refreshed, budget and drops
        <table>.<seq>.parquet       rows of python.<table>; a table is one file or several parts
        end.json                    the rank's own account of its end (exit, signal, exception)
        death.json                  the watchdog's account (exit status, last stack), any death

``<root>`` is ``$PROBE_POSTMORTEM_DIR`` (a shared filesystem: every node writes to one place),
else ``<run dir>/postmortem``. ``<job>`` is the launcher's job id (``job_name``). Stdlib only:
the CLI, the agent and the watchdog all read it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from collections.abc import Mapping
from typing import Any

from . import runfiles

DIR_VAR = "PROBE_POSTMORTEM_DIR"
#: ``always`` keeps the copy of a clean exit too; ``off`` writes none.
MODE_VAR = "PROBE_POSTMORTEM"
META = "meta.json"
END = "end.json"
DEATH = "death.json"
RANK_PREFIX = "rank-"
PARQUET = ".parquet"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def root(environ: Mapping[str, str] | None = None) -> str:
    """``$PROBE_POSTMORTEM_DIR``, else ``<run dir>/postmortem``."""
    env = os.environ if environ is None else environ
    given = env.get(DIR_VAR, "").strip()
    return os.path.abspath(given) if given else os.path.join(runfiles.run_dir(env), "postmortem")


def roots(environ: Mapping[str, str] | None = None) -> list[str]:
    """Where the CLI looks: ``root`` and, when PROBE_POSTMORTEM_DIR moves it, the default too."""
    env = os.environ if environ is None else environ
    default = os.path.join(runfiles.run_dir(env), "postmortem")
    first = root(env)
    return [first] if first == default else [first, default]


def job_name(environ: Mapping[str, str], pid: int) -> str:
    """The job's directory name, the same on every rank of the job: PROBE_JOB, the launcher's
    run id (torchrun's TORCHELASTIC_RUN_ID unless it is "none", SLURM_JOB_ID), the rendezvous
    address, else this process's pid (a lone process is its own job)."""
    run_id = environ.get("TORCHELASTIC_RUN_ID", "")
    for value in (environ.get("PROBE_JOB"), "" if run_id == "none" else run_id,
                  environ.get("SLURM_JOB_ID")):
        if value and value.strip():
            return _SAFE.sub("_", value.strip())[:80]
    addr, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if addr and port:
        return _SAFE.sub("_", f"{addr}-{port}")[:80]
    return f"pid-{pid}"


def rank_dir(root_dir: str, job: str, rank: int) -> str:
    return os.path.join(root_dir, job, f"{RANK_PREFIX}{rank}")


def rank_of(name: str) -> int | None:
    """``rank-3`` -> 3."""
    tail = name[len(RANK_PREFIX):] if name.startswith(RANK_PREFIX) else ""
    return int(tail) if tail.isdigit() else None


def make_private(path: str) -> None:
    """``path`` and the missing directories above it, 0700; an existing one must be ours and
    a real directory (another uid may have made it first on a shared filesystem)."""
    parent = os.path.dirname(path)
    if parent and parent != path and not os.path.isdir(parent):
        make_private(parent)  # each level 0700: makedirs' mode is cut by the umask
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"{path} is not a directory of uid {os.getuid()}")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)


def write_json(path: str, record: Mapping[str, Any]) -> None:
    """Atomically, 0600."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(record, f, default=str)
    os.replace(tmp, path)


def read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def table_files(rank_path: str) -> dict[str, list[str]]:
    """short table name -> its parquet files in ``rank_path``, oldest part first."""
    out: dict[str, list[tuple[int, str]]] = {}
    try:
        names = os.listdir(rank_path)
    except OSError:
        return {}
    for name in names:
        if not name.endswith(PARQUET):
            continue
        table, _, seq = name[: -len(PARQUET)].rpartition(".")
        if table and seq.isdigit():
            out.setdefault(table, []).append((int(seq), os.path.join(rank_path, name)))
    return {t: [p for _, p in sorted(v)] for t, v in out.items()}


def dir_bytes(path: str) -> int:
    total = 0
    for base, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                pass
    return total


def remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    parent = os.path.dirname(path)
    try:
        os.rmdir(parent)  # the job's directory, once its last rank is gone
    except OSError:
        pass
