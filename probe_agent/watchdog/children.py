"""A rank's child processes and their Python stacks, read from outside (stdlib only; runs in
the watchdog, for ``GET /v1/backtrace?children=1``).

Why here: a DataLoader worker that never returns a batch is a process of its own with no agent
(workers never start one), often blocked in a C call or holding its own GIL; and the rank that
waits for it may hold its GIL too. The watchdog answers with neither: it lists the children from
/proc and reads each with py-spy, as it reads a stuck rank (reader.py's ``StackReader``).

- Which children: the direct children of the rank's process (``/proc/PID/task/*/children``,
  else a scan of /proc for that parent), the watchdog itself left out. DataLoader workers are
  direct children (forked or spawned by the rank); a grandchild is not read.
- DataLoader workers are recognised by torch's process name (``pt_data_worker``) or by
  ``_worker_loop`` on their stack; their ``worker_id`` is a local of ``_worker_loop``, so each
  child is read with ``--locals`` and the locals are dropped afterwards unless asked for.
- Cost: py-spy pauses each child for the moment of its read (14-36 ms measured for a rank,
  about the same for a worker), at most ``PARALLEL`` at a time and only when asked.
- Without py-spy (not installed, ptrace refused) a child's threads come from /proc (state and
  kernel wait channel), and ``error`` says why there is no Python stack: faulthandler cannot be
  used, since a child never registered the agent's dump signal.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from ..redact import redact_locals
from .reader import ReadError, StackReader, _proc_text, proc_state, read_proc

#: Children read per request; the rest are listed by pid, name and state only.
MAX_CHILDREN = 16
#: py-spy reads of children running at once (each pauses its child briefly).
PARALLEL = 4
#: torch names its DataLoader worker processes so (``_set_thread_name`` in ``_worker_loop``).
WORKER_NAME = "pt_data_worker"
WORKER_LOOP = "_worker_loop"


def child_pids(pid: int, exclude: frozenset[int] = frozenset()) -> list[int]:
    """The pids of ``pid``'s direct children, ``exclude`` left out."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: set[int] = set()
    have_file = False
    for tid in tasks:
        path = f"/proc/{pid}/task/{tid}/children"
        if os.path.exists(path):
            have_file = True
            found.update(int(x) for x in _proc_text(path).split() if x.isdigit())
    if not have_file:  # a kernel without CONFIG_PROC_CHILDREN: scan every process's parent
        found = {p for p in _all_pids() if _parent(p) == pid}
    return sorted(found - exclude)


def _all_pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _parent(pid: int) -> int | None:
    try:
        return int(_proc_text(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return ""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")[:300]


def worker_id(threads: list[dict[str, Any]]) -> int | None:
    """The DataLoader worker id: the ``worker_id`` local of ``_worker_loop`` on a stack."""
    for t in threads:
        for f in t.get("frames") or ():
            if f.get("func") == WORKER_LOOP and (f.get("locals") or {}).get("worker_id"):
                try:
                    return int(str(f["locals"]["worker_id"]))
                except ValueError:
                    return None
    return None


def _is_worker(name: str, threads: list[dict[str, Any]]) -> bool:
    return name == WORKER_NAME or any(
        f.get("func") == WORKER_LOOP for t in threads for f in t.get("frames") or ())


class ChildReaders:
    """One ``StackReader`` per child, kept while the child lives. Its py-spy slot makes reads of
    one child take turns (two tracers on one process refuse each other: a `probe hang` and a
    `probe backtrace --children` at the same moment left one without the worker's stack), and a
    dump that began after a request arrived is shared with it."""

    def __init__(self) -> None:
        self._readers: dict[int, StackReader] = {}

    def get(self, pid: int, pyspy: str | None) -> StackReader:
        reader = self._readers.get(pid)
        if reader is None or reader.pyspy != pyspy:
            # No faulthandler route: a child never registered the agent's dump signal, and
            # sending it would kill it (its default action).
            reader = self._readers[pid] = StackReader(pid, pyspy, "py-spy", dump_path="",
                                                      dump_signal=None)
        return reader

    def keep_only(self, pids: list[int]) -> None:
        for gone in set(self._readers) - set(pids):
            del self._readers[gone]


async def read_child(pid: int, why_no_pyspy: str | None, reader: StackReader, *,
                     want_locals: bool, secrets: bool, all_threads: bool) -> dict[str, Any]:
    """One child: ``{pid, name, cmdline, state, kind, worker_id, route, threads, error,
    elapsed_ms}``. ``threads`` are its main thread only unless ``all_threads``."""
    started = time.monotonic()
    name = _proc_text(f"/proc/{pid}/comm")
    out: dict[str, Any] = {"pid": pid, "name": name, "cmdline": _cmdline(pid),
                           "state": proc_state(pid), "kind": "process", "worker_id": None,
                           "route": None, "threads": [], "error": None}
    threads: list[dict[str, Any]]
    try:
        if why_no_pyspy is not None:
            raise ReadError(why_no_pyspy)
        res = await reader.read(locals=True)
        threads, out["route"] = res["threads"], res["route"]
    except (ReadError, PermissionError) as e:
        try:
            threads = read_proc(pid)
        except ReadError as gone:
            out["error"] = str(gone).replace("the rank", "the child")
            threads = []
        else:
            out["route"] = "proc"
            out["error"] = f"no Python stack: {e}"
    if _is_worker(name, threads):
        out["kind"], out["worker_id"] = "dataloader_worker", worker_id(threads)
    for t in threads:
        for f in t.get("frames") or ():
            f["locals"] = redact_locals(f.get("locals"), secrets) if want_locals else None
    out["threads"] = threads if all_threads else [t for t in threads if t.get("is_main")]
    out["elapsed_ms"] = round((time.monotonic() - started) * 1e3, 3)
    return out


async def read_children(pid: int, reader: StackReader, readers: ChildReaders, *,
                        want_locals: bool = False, secrets: bool = False,
                        all_threads: bool = False) -> list[dict[str, Any]]:
    """Every direct child of the rank ``pid`` (the watchdog left out), oldest pid first; the
    first ``MAX_CHILDREN`` read with py-spy (the rank's ``reader`` says whether py-spy is
    usable; ``readers`` keeps each child's own)."""
    pids = child_pids(pid, frozenset({os.getpid()}))
    readers.keep_only(pids)
    why_not = reader.pyspy_unusable()
    slots = asyncio.Semaphore(PARALLEL)

    async def one(child: int) -> dict[str, Any]:
        async with slots:
            try:
                return await read_child(child, why_not, readers.get(child, reader.pyspy),
                                        want_locals=want_locals, secrets=secrets,
                                        all_threads=all_threads)
            except Exception as e:  # one child must not cost the answer for the others
                return {"pid": child, "name": _proc_text(f"/proc/{child}/comm"),
                        "state": proc_state(child), "kind": "process", "worker_id": None,
                        "route": None, "threads": [], "error": f"{type(e).__name__}: {e}"}

    read = await asyncio.gather(*(one(c) for c in pids[:MAX_CHILDREN]))
    rest: list[dict[str, Any]] = [
        {"pid": c, "name": _proc_text(f"/proc/{c}/comm"), "cmdline": _cmdline(c),
         "state": proc_state(c), "kind": "process", "worker_id": None, "route": None,
         "threads": [], "error": f"not read: only the first {MAX_CHILDREN} children are"}
        for c in pids[MAX_CHILDREN:]]
    return [c for c in [*read, *rest] if c.get("state") is not None or c.get("threads")]
