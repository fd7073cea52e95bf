"""The rank as seen from its watchdog: alive or dead, how it died, what it last did.

Exit status. The watchdog is the rank's child, so it cannot ``waitpid`` it, and the rank's
parent (torchrun, a shell) reaps it. What we do, most exact first:

1. ``pidfd_open`` + poll wakes us the moment the rank exits (it is then a zombie until its
   parent reaps it); we read the wait status from field 52 of ``/proc/<pid>/stat`` at once.
   torchrun polls its workers every 0.1 s, so we win that race; a parent blocked in
   ``waitpid`` (a shell, ``subprocess.run``) usually wins it.
2. What the agent recorded inside the rank: ``<pid>.crash`` (faulthandler: SIGSEGV, SIGABRT,
   SIGBUS, SIGFPE, SIGILL), ``<pid>.term`` (a chained SIGTERM handler) and ``<pid>.exit.json``
   (written at interpreter exit, with the uncaught exception if there was one).
3. Nothing ran inside the rank at all: only SIGKILL does that (kill -9, the OOM killer, a
   launcher's escalation), or ``os._exit``. Reported as SIGKILL with ``inferred: true``, and
   the OOM killer is named when the rank's cgroup ``oom_kill`` count rose.

Last backtrace: the fatal-signal or SIGTERM dump when there is one, else the traceback of the
uncaught exception, else the newest periodic snapshot (every PROBE_WATCHDOG_SNAPSHOT_S, from
the in-process agent; from py-spy only while the agent does not answer).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from probe_protocol.runfiles import RunFiles

from . import beat
from .reader import StackReader, fatal_signal, parse_faulthandler

Fetch = Callable[[], Awaitable[dict[str, Any] | None]]


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat from field 3 (state) on; index = field number - 3."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


def _oom_kills(pid: int) -> int | None:
    """The oom_kill counter of the cgroup ``pid`` is in (v2 memory.events, or v1)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            cand = f"/sys/fs/cgroup{path}/memory.events"
        elif "memory" in controllers.split(","):
            cand = f"/sys/fs/cgroup/memory{path}/memory.oom_control"
        else:
            continue
        try:
            with open(cand) as f:
                for entry in f.read().splitlines():
                    key, _, value = entry.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def describe_exit(e: dict[str, Any]) -> str:
    if e.get("signal"):
        text = f"killed by signal {e['signal']} ({e.get('signal_name')})"
        if e.get("inferred"):
            text += ", inferred: no exit handler ran"
    elif e.get("code") is not None:
        text = f"exited with code {e['code']}"
    else:
        text = "exited (status unknown: its parent reaped it first)"
    if e.get("exception"):
        text += f" after an uncaught {e['exception']}"
    if e.get("oom_killer"):
        text += "; the OOM killer killed a process in its cgroup"
    oom = e.get("cuda_oom")
    if oom:
        text += (f"; CUDA out of memory at step {oom.get('step')} on {oom.get('device')}: "
                 f"{oom.get('request_mib', 0):.1f} MiB asked, largest free block "
                 f"{oom.get('largest_free_block_mib', 0):.1f} MiB, reserved "
                 f"{oom.get('reserved_mib', 0):.0f} of {oom.get('capacity_mib', 0):.0f} MiB"
                 + (" (fragmented)" if oom.get("fragmented") else ""))
    return text


class RankWatch:
    """Liveness and forensics of the rank ``pid``.

    Args:
        on_death: called once on the event loop when the rank has exited and ``exit`` is set.
    """

    def __init__(self, pid: int, files: RunFiles, reader: StackReader,
                 on_death: Callable[[], None]) -> None:
        self.pid = pid
        self.files = files
        self.reader = reader
        self.on_death = on_death
        fields = _stat(pid)
        self.starttime = fields[19] if fields else None
        # The rank's parent is its launcher (torchrun, deepspeed's launch.py, Lightning's rank
        # 0, a shell): the job. Remembered with its start time, so a reused pid is not it.
        self.parent = int(fields[1]) if fields else 0
        parent = _stat(self.parent) if self.parent > 1 else None
        self.parent_starttime = parent[19] if parent else None
        self.oom_before = _oom_kills(pid)
        self.alive = True
        self.exit: dict[str, Any] | None = None
        self.died_at: float | None = None
        self.last_step: int | None = None
        self.last_snapshot: dict[str, Any] | None = None
        self.last_backtrace: dict[str, Any] | None = None
        self._pidfd: int | None = None
        reader.exiting = lambda: os.path.exists(files.exit_record)

    # -- liveness ---------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self._pidfd = None  # kernel < 5.3: poll /proc instead
        if self._pidfd is not None:
            loop.add_reader(self._pidfd, self._exited, loop)
        else:
            loop.call_later(0.1, self._poll_proc, loop)
        if not self._same_process():
            self._exited(loop)

    def job_gone(self) -> bool:
        """The rank's launcher has exited too: nobody is left to ask what became of the rank.
        False when the launcher is unknown or is init (pid 1)."""
        if self.parent_starttime is None:
            return False
        fields = _stat(self.parent)
        return fields is None or fields[19] != self.parent_starttime or fields[0] in "ZX"

    def _same_process(self) -> bool:
        fields = _stat(self.pid)
        return fields is not None and fields[19] == self.starttime and fields[0] not in "ZX"

    def _poll_proc(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.alive and self._same_process():
            loop.call_later(0.1, self._poll_proc, loop)
        elif self.alive:
            self._exited(loop)

    def heartbeat(self) -> tuple[float, int | None, float] | None:
        hb = beat.read(self.files.beat)
        if hb is not None:
            self.last_step = hb[1] if hb[1] is not None else self.last_step
        return hb

    # -- death ------------------------------------------------------------------------------
    def _exited(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.alive:
            return
        status = self._zombie_status()  # first: the parent may reap it any moment now
        if self._pidfd is not None:
            loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self.alive = False
        self.died_at = time.time()
        self.heartbeat()
        self.exit = self._compose_exit(status)
        self.last_backtrace = self._final_backtrace()
        self.on_death()

    def _zombie_status(self) -> int | None:
        fields = _stat(self.pid)
        if not fields or fields[19] != self.starttime or fields[0] != "Z" or len(fields) < 50:
            return None
        try:
            return int(fields[49])  # field 52: exit_code, in waitpid's format
        except ValueError:
            return None

    def _read(self, path: str) -> str:
        try:
            with open(path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _read_json(self, path: str) -> dict[str, Any]:
        try:
            with open(path) as f:
                rec = json.load(f)
            return rec if isinstance(rec, dict) else {}
        except (OSError, ValueError):
            return {}

    def _exit_record(self) -> dict[str, Any]:
        try:
            with open(self.files.exit_record) as f:
                rec = json.load(f)
            return rec if isinstance(rec, dict) else {}
        except (OSError, ValueError):
            return {}

    def _compose_exit(self, status: int | None) -> dict[str, Any]:
        record = self._exit_record()
        crash = fatal_signal(self._read(self.files.crash))
        termed = bool(self._read(self.files.term).strip())
        e: dict[str, Any] = {"code": None, "signal": None}
        if status is not None:
            e["source"] = "proc"
            if status & 0x7F:
                e["signal"] = status & 0x7F
                e["core_dumped"] = bool(status & 0x80)
            else:
                e["code"] = (status >> 8) & 0xFF
        elif crash:
            e.update(signal=crash, source="faulthandler")
        elif termed:
            e.update(signal=int(signal.SIGTERM), source="faulthandler")
        elif record:
            e.update(code=1 if record.get("exception") else None, source="agent")
        else:
            e.update(signal=int(signal.SIGKILL), source="inferred", inferred=True)
        if e["signal"]:
            e["signal_name"] = signal_name(e["signal"])
        oom = self._read_json(self.files.oom)
        if oom:  # the agent's OOM observer left the moment (collectors/oom.py)
            e["cuda_oom"] = oom
        if record.get("exception"):
            e["exception"] = record["exception"]
        oom_after = _oom_kills_from_path(self.files) if self.oom_before is not None else None
        if oom_after is not None and self.oom_before is not None and oom_after > self.oom_before:
            e["oom_killer"] = True
        e["description"] = describe_exit(e)
        return e

    def _final_backtrace(self) -> dict[str, Any] | None:
        for path, route in ((self.files.crash, "faulthandler at the fatal signal"),
                            (self.files.term, "faulthandler at SIGTERM")):
            threads = parse_faulthandler(self._read(path), self.reader.names)
            if threads:
                for t in threads:
                    t.pop("current", None)
                return {"taken_at": self.died_at, "route": route, "threads": threads}
        tb = self._exit_record().get("traceback")
        if tb:
            thread = {"thread_id": None, "thread_name": "MainThread", "is_main": True,
                      "is_agent": False, "frames": tb}
            return {"taken_at": self.died_at, "route": "uncaught exception traceback",
                    "threads": [thread]}
        return self.last_snapshot

    # -- periodic snapshots -----------------------------------------------------------------
    async def snapshot_loop(self, fetch_in_process: Fetch, every_s: float, stale_s: float) -> None:
        """Keep ``last_snapshot`` fresh while the rank lives (for crash forensics)."""
        while self.alive:
            try:
                await self.snapshot(fetch_in_process, stale_s)
            except Exception as e:  # noqa: BLE001 - a failed snapshot must not end the loop
                print(f"probe watchdog: snapshot failed: {e!r}", flush=True)
            await asyncio.sleep(every_s)

    async def snapshot(self, fetch_in_process: Fetch, stale_s: float) -> None:
        body = await fetch_in_process()
        route = "in-process snapshot"
        if body is None or not body.get("threads"):
            hb = self.heartbeat()
            if not self.alive or hb is None or hb[0] < stale_s or self.reader.pyspy_unusable() \
                    or self.reader.exiting():
                return  # out-of-process snapshots only of a live, frozen rank, and by py-spy
            res = await self.reader.read_pyspy()
            body, route = res, f"{res['route']} snapshot"
        threads = body.get("threads") or []
        for t in threads:
            if isinstance(t.get("thread_id"), int) and t.get("thread_name"):
                self.reader.names[t["thread_id"]] = t["thread_name"]
        # Forensics keep the program's threads only (the agent's own are noise after a death).
        threads = sorted((t for t in threads if not t.get("is_agent")),
                         key=lambda t: (not t.get("is_main"), str(t.get("thread_name"))))
        if self.alive:
            self.last_snapshot = {"taken_at": time.time(), "route": route, "threads": threads}


def _oom_kills_from_path(files: RunFiles) -> int | None:
    """The oom_kill count of the cgroup the watchdog shares with its rank (the rank is gone)."""
    return _oom_kills(os.getpid())
