"""The post-mortem directory: the on-disk copy of a rank's tables that outlives the rank.

Layout (written by the agent and its watchdog, read by `probe postmortem` and `probe -t DIR`)::

    <root>/<job>/                   0700
        .probe-postmortem.json      the marker: this uid's agent made it (owned_tree.py)
        rank-<r>/                   0700, every file 0600
            meta.json               who wrote it, when it was last refreshed, budget and drops
            <table>.<seq>.parquet   rows of python.<table>; a table is one file or several parts
            end.json                the rank's own account of its end (exit, signal, exception)
            death.json              the watchdog's account (exit status, last stack), any death
            collectives.strip       the last explicit collectives, written as they start and
                                    end (a shared mapping: it outlives an aborted rank)

``<root>`` is ``$PROBE_POSTMORTEM_DIR`` (a shared filesystem: every node writes to one place),
else ``<run dir>/postmortem``. ``<job>`` names one run (``job_name``). Stdlib only:
the CLI, the agent and the watchdog all read it.
"""

from __future__ import annotations

import json
import os
import re
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
#: The collectives' black box (probe_agent/collectors/collective_strip.py): ``STRIP_SLOTS``
#: slots of ``STRIP_SLOT`` bytes, each a JSON list of ``STRIP_FIELDS`` padded with NUL.
STRIP = "collectives.strip"
STRIP_SLOTS = 32
STRIP_SLOT = 512
STRIP_FIELDS = ("n", "pg", "seq", "op", "shapes", "dtype", "start_time", "end_time", "state",
                "error", "thread_name", "callsite")
PARQUET = ".parquet"
#: The job directory's proof of origin (owned_tree.py): only a directory holding it is swept.
MARKER = ".probe-postmortem.json"
MARKER_KIND = "postmortem-copy"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: Every name the copy writes in a rank's directory: the records, the table parts, and the
#: temporary files they are written as before the rename (``tmp_name``).
_LAYOUT = re.compile(r"(meta|end|death)\.json|[A-Za-z0-9_]+\.[0-9]+\.parquet|"
                     r"collectives\.strip")
_TMP = re.compile(r"\.((meta|end|death)\.json|[A-Za-z0-9_]+\.[0-9]+\.parquet)"
                  r"\.[0-9]+-[0-9a-f]{8}\.tmp")


def tmp_name(final: str) -> str:
    """The temporary name a file is written as before it is renamed to ``final`` (a name)."""
    return f".{final}.{os.getpid()}-{os.urandom(4).hex()}.tmp"


def is_layout_file(name: str) -> bool:
    """A name the copy writes in a rank's directory (the sweep removes only these)."""
    return bool(_LAYOUT.fullmatch(name) or _TMP.fullmatch(name))


def is_tmp(name: str) -> bool:
    return bool(_TMP.fullmatch(name))


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


def run_id(environ: Mapping[str, str]) -> str | None:
    """The launcher's own name for this run, the same on every rank of it, or None: PROBE_JOB,
    torchrun's TORCHELASTIC_RUN_ID unless it is "none" (its default), with ``-a<N>`` after the
    N-th restart of the workers (each attempt its own copy: a clean retry must not remove the
    crash that caused it), else SLURM_JOB_ID with ``.<step>`` (each srun of an allocation) and
    ``-r<N>`` after the N-th requeue."""
    def given(name: str) -> str:
        return (environ.get(name) or "").strip()

    if given("PROBE_JOB"):
        return _SAFE.sub("_", given("PROBE_JOB"))[:80]
    restart, requeue = given("TORCHELASTIC_RESTART_COUNT"), given("SLURM_RESTART_COUNT")
    if given("TORCHELASTIC_RUN_ID") not in ("", "none"):
        tail = f"-a{restart}" if restart.isdigit() and int(restart) > 0 else ""
        return _SAFE.sub("_", given("TORCHELASTIC_RUN_ID"))[:72] + tail
    if given("SLURM_JOB_ID"):
        step = given("SLURM_STEP_ID")
        tail = (f".{step}" if step.isdigit() else "") + (
            f"-r{requeue}" if requeue.isdigit() and int(requeue) > 0 else "")
        return _SAFE.sub("_", given("SLURM_JOB_ID"))[:60] + tail
    return None


def job_name(environ: Mapping[str, str], pid: int, launched: str) -> str:
    """The job's directory name: ``run_id``; without one, the rendezvous address and
    ``launched`` (when and by which process this launch started: the same on every rank of a
    node, different for the next run on port 29500), ``<addr>-<port>-<launched>``, which the
    ranks of other nodes then join (probe_agent/postmortem/launch.py); a lone process is
    ``pid-<pid>-<launched>``."""
    rid = run_id(environ)
    if rid:
        return rid
    addr, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if addr and port:
        return _SAFE.sub("_", f"{addr}-{port}")[:48] + "-" + _SAFE.sub("_", launched)[:31]
    return f"pid-{pid}-" + _SAFE.sub("_", launched)[:31]


def is_job_name(name: str) -> bool:
    """A name ``job_name`` could have made (a value read from the job's store is data)."""
    return 0 < len(name) <= 80 and not _SAFE.search(name) and name not in (".", "..")


def rank_dir(root_dir: str, job: str, rank: int) -> str:
    return os.path.join(root_dir, job, f"{RANK_PREFIX}{rank}")


def rank_of(name: str) -> int | None:
    """``rank-3`` -> 3."""
    tail = name[len(RANK_PREFIX):] if name.startswith(RANK_PREFIX) else ""
    return int(tail) if tail.isdigit() else None


def write_atomic(path: str, write: Any, durable: bool = True) -> int:
    """``write(binary file)`` into a fresh 0600 temporary beside ``path``, fsync, rename over
    ``path``, fsync the directory: a reader (or a kill, a full disk) sees the old file or the
    new one, whole, never a part. The temporary is gone when this raises. Returns the size.

    ``durable=False`` renames before any fsync: for a record written while the process is
    being killed (``end.json``), where an fsync on a busy disk took longer than the grace
    before SIGKILL and the record never got its name. A process's death does not lose a
    renamed file (the page cache is the kernel's); only a crash of the machine could."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, tmp_name(name))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with open(fd, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    sync_dir(folder)
    return size


def sync_dir(folder: str) -> None:
    try:
        dfd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass  # some filesystems refuse a directory fsync; the rename stands
    finally:
        os.close(dfd)


def write_json(path: str, record: Mapping[str, Any], durable: bool = True) -> None:
    """Atomically (``write_atomic``), 0600."""
    write_atomic(path, lambda f: f.write(json.dumps(record, default=str).encode()), durable)


#: The largest record read (a copy's JSON files are a few KiB).
MAX_JSON_BYTES = 1 << 20


def read_json(path: str, problems: list[str] | None = None) -> dict[str, Any]:
    """The JSON object in ``path``, else {} (missing, or not a regular file, over
    MAX_JSON_BYTES, not JSON, nested too deep: a crafted copy must not hang or crash a reader;
    why goes to ``problems`` when given, one line, unless the file is simply missing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as e:
        why = f"{path}: {e.strerror or e}"
        rec = None
    else:
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_JSON_BYTES:
                why = (f"{path} is not a regular file" if not stat.S_ISREG(st.st_mode) else
                       f"{path} is {st.st_size} bytes, over {MAX_JSON_BYTES}")
                rec = None
            else:
                try:
                    rec = json.loads(f.read(MAX_JSON_BYTES + 1))
                    why = f"{path} does not hold a JSON object"
                except (ValueError, RecursionError) as e:
                    rec = None
                    why = f"{path} is not valid JSON ({type(e).__name__})"
    if isinstance(rec, dict):
        return rec
    if problems is not None:
        problems.append(why)
    return {}


def read_strip(rank_path: str) -> list[dict[str, Any]]:
    """The records of a rank's ``collectives.strip``, oldest first (torn slots skipped)."""
    try:  # no link, no FIFO (a crafted copy must not hang the CLI), bounded
        fd = os.open(os.path.join(rank_path, STRIP),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        data = f.read(STRIP_SLOTS * STRIP_SLOT)
    out = []
    for i in range(0, len(data), STRIP_SLOT):
        raw = data[i:i + STRIP_SLOT].rstrip(b"\0")
        try:
            values = json.loads(raw) if raw else None
        except ValueError:
            continue
        if isinstance(values, list) and len(values) == len(STRIP_FIELDS):
            out.append(dict(zip(STRIP_FIELDS, values)))
    return sorted(out, key=lambda r: r["n"] if isinstance(r["n"], int) else -1)


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
