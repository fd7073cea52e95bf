"""Reading a rank's Python stacks from outside it (stdlib only; runs in the watchdog).

Two routes, both answering in the shape of the in-process ``/v1/backtrace`` (``threads[]`` with
``frames[]``, innermost first):

- ``py-spy``: ``py-spy dump --pid P --json`` (``--locals``, ``--native`` when asked). Needs ptrace.
  Measured here: 14–36 ms, the GIL held included; ``--native`` 1.3–2.1 s on a torch process,
  which is paused meanwhile, so it is opt-in. Its ``owns_gil`` names the GIL holder.
- ``faulthandler``: signal the rank (the agent registered ``faulthandler.register(SIG,
  all_threads=True)`` on ``<pid>.dump`` at start), then parse what was appended to the file.
  Works without ptrace and without the GIL; gives Python frames only, no locals, no GIL holder.

``auto`` tries py-spy and remembers a ptrace refusal (a container without SYS_PTRACE), then uses
faulthandler and says why in ``reason``.

A stopped rank (state ``T``: SIGSTOP, SIGTSTP; ``t``: held by a debugger) runs no signal handler
and cannot be suspended by py-spy, whose plain ``dump`` then fails. It is read with
``py-spy dump --nonblocking``, which only reads memory (safe: a stopped process cannot change
under it; py-spy refuses ``--native`` with it). Without py-spy, ``/proc`` still gives each
thread's state and kernel wait channel (route ``proc``), and ``stopped`` says how to resume it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from typing import Any

from ..collectors.stacks import hide_agent_frames, is_agent_thread

PYSPY_TIMEOUT_S = 5.0
PYSPY_NATIVE_TIMEOUT_S = 20.0
DUMP_WAIT_S = 1.0
#: After ptrace was refused, py-spy is tried again this much later (another tracer may have
#: been attached at that moment: gdb, a user's py-spy).
RETRY_PTRACE_S = 30.0
_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
FATAL_SIGNALS = {
    "Segmentation fault": 11, "Aborted": 6, "Bus error": 7, "Floating point exception": 8,
    "Illegal instruction": 4,
}


def proc_state(pid: int, tid: int | None = None) -> str | None:
    """The one-letter state of ``pid`` (or of its thread ``tid``) from /proc; None if gone."""
    where = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    try:
        with open(where, "rb") as f:
            return f.read().decode(errors="replace").rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _proc_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def stop_note(pid: int) -> str | None:
    """A sentence saying that ``pid`` is stopped and how to resume it, or None while it runs."""
    state = proc_state(pid)
    if state == "T":
        return (f"the rank is stopped (state T: SIGSTOP or SIGTSTP); resume it with "
                f"`kill -CONT {pid}`")
    if state == "t":
        tracer = next((line.split()[1] for line in _proc_text(f"/proc/{pid}/status").splitlines()
                       if line.startswith("TracerPid:")), "?")
        if tracer.isdigit() and _ppid(int(tracer)) == os.getpid():
            return None  # our own py-spy, pausing it for a moment to read it
        return (f"the rank is stopped by a tracer (state t: ptrace by pid {tracer}, a debugger); "
                "it resumes when that tracer continues or detaches")
    return None


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().decode(errors="replace").rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def read_proc(pid: int) -> list[dict[str, Any]]:
    """What /proc tells of each thread without ptrace: name, state and kernel wait channel,
    as one ``Native`` pseudo-frame (the Python frames need py-spy or a running rank)."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except (OSError, ValueError):
        raise ReadError(f"/proc/{pid} is gone (the rank exited)") from None
    threads = []
    for tid in tids:
        wchan = _proc_text(f"/proc/{pid}/task/{tid}/wchan") or "0"
        state = proc_state(pid, tid) or "?"
        name = _proc_text(f"/proc/{pid}/task/{tid}/comm") or f"Thread-{tid}"
        threads.append({
            "thread_id": tid, "thread_name": "MainThread" if tid == pid else name,
            "is_main": tid == pid, "is_agent": False, "os_thread_id": tid, "owns_gil": False,
            "state": state, "wchan": None if wchan == "0" else wchan,
            "frames": [{"depth": 0, "func": wchan if wchan != "0" else f"(state {state})",
                        "file": "kernel", "lineno": 0, "frame_type": "Native", "locals": None}],
        })
    return threads


class ReadError(Exception):
    """No route could read the stacks; the message says why (for the error body)."""


def _short(func: str) -> str:
    """py-spy reports ``co_qualname`` (``Thread.run``); the in-process route ``co_name``.
    Use the last part so stacks from both routes group together."""
    return func.rsplit(".", 1)[-1] if not func.startswith("<") else func


def thread_from_pyspy(t: dict[str, Any], pid: int) -> dict[str, Any]:
    frames: list[dict[str, Any]] = []
    for f in t.get("frames") or []:
        native = bool(f.get("module")) and not str(f.get("filename", "")).endswith(".py")
        loc = None
        if isinstance(f.get("locals"), list):
            loc = {v.get("name"): v.get("repr") for v in f["locals"] if isinstance(v, dict)}
        frames.append({
            "depth": len(frames),
            "func": str(f.get("name")) if native else _short(str(f.get("name"))),
            "file": f.get("filename") or f.get("module"),
            "lineno": f.get("line") or 0,
            "frame_type": "Native" if native else "Python",
            "locals": loc,
        })
    name = t.get("thread_name") or f"Thread-{t.get('os_thread_id')}"
    return hide_agent_frames({
        "thread_id": t.get("thread_id"),
        "thread_name": name,
        "is_main": t.get("os_thread_id") == pid or name == "MainThread",
        "is_agent": is_agent_thread(str(name)),
        "os_thread_id": t.get("os_thread_id"),
        "owns_gil": bool(t.get("owns_gil")),
        "active": t.get("active"),
        "frames": frames,
    })


def parse_faulthandler(text: str, names: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """Threads of one faulthandler dump in ``text``, innermost frame first.

    ``names`` maps thread ids to names (from earlier in-process snapshots): faulthandler prints
    ids only. A thread whose outermost frame is not in threading.py is taken as the main thread.
    """
    names = names or {}
    threads: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    for line in text.splitlines():
        h = _HEADER.match(line)
        if h:
            tid = int(h.group(2), 16)
            cur = {"thread_id": tid, "thread_name": names.get(tid, f"Thread-{tid:#x}"),
                   "is_main": False, "is_agent": is_agent_thread(names.get(tid, "")),
                   "current": h.group(1) == "Current thread", "frames": []}
            threads.append(cur)
            continue
        m = _FRAME.match(line)
        if m and cur is not None:
            cur["frames"].append({"depth": len(cur["frames"]), "func": m.group(3),
                                  "file": m.group(1), "lineno": int(m.group(2)),
                                  "frame_type": "Python", "locals": None})
    for t in threads:
        name = names.get(t["thread_id"])
        outer = t["frames"][-1]["file"] if t["frames"] else ""
        t["is_main"] = name == "MainThread" if name else not outer.endswith("threading.py")
        hide_agent_frames(t)  # the agent's frames are not the user's code
    return threads


def fatal_signal(text: str) -> int | None:
    """The signal named by the last ``Fatal Python error: ...`` line of a crash dump."""
    found = None
    for line in text.splitlines():
        if line.startswith("Fatal Python error:"):
            found = FATAL_SIGNALS.get(line.split(":", 1)[1].strip())
    return found


class StackReader:
    """Reads the stacks of ``pid`` through py-spy or faulthandler (see the module docstring).

    Args:
        pyspy: path of the py-spy binary; None leaves faulthandler only.
        mode: ``auto``, ``py-spy`` or ``faulthandler`` (PROBE_WATCHDOG_READER).
        dump_path: the file the rank's faulthandler writes to on ``dump_signal``.
    """

    def __init__(self, pid: int, pyspy: str | None, mode: str, dump_path: str,
                 dump_signal: int | None) -> None:
        self.pid = pid
        self.pyspy = pyspy
        self.mode = mode
        self.dump_path = dump_path
        self.dump_signal = dump_signal
        self.names: dict[int, str] = {}
        #: Set by the watchdog: True once the rank has begun to exit (no signals then).
        self.exiting = lambda: False
        self.ptrace_refused: str | None = None
        self._refused_at = 0.0
        # One py-spy at a time: two tracers on one process refuse each other (EPERM), and a
        # second dump taken at the same moment tells nothing new.
        self._pyspy_slots = asyncio.Semaphore(1)
        self._recent: tuple[float, tuple[bool, bool], dict[str, Any]] | None = None
        self._dump_lock = asyncio.Lock()

    def pyspy_unusable(self) -> str | None:
        """Why py-spy will not be tried, or None when it will."""
        if self.mode == "faulthandler":
            return "PROBE_WATCHDOG_READER=faulthandler"
        if not self.pyspy:
            return "py-spy is not installed (pip install 'probe-torch[agent]')"
        if self.ptrace_refused and time.monotonic() - self._refused_at > RETRY_PTRACE_S:
            self.ptrace_refused = None  # capabilities rarely change, but another tracer leaves
        return self.ptrace_refused

    async def read(self, *, locals: bool = False, native: bool = False) -> dict[str, Any]:
        """``{route, threads, gil_holder, note, stopped}``; raises ReadError when no route
        works. ``stopped`` (a sentence, or None) says the rank is stopped and how to resume it."""
        stopped = stop_note(self.pid)
        if stopped is None:
            try:
                return await self._read_live(locals=locals, native=native)
            except ReadError:
                stopped = stop_note(self.pid)  # stopped meanwhile: py-spy and the dump fail then
                if stopped is None:
                    raise
        return await self._read_stopped(stopped, self.pyspy_unusable(), locals=locals)

    async def _read_stopped(self, stopped: str, why_not: str | None, *,
                            locals: bool) -> dict[str, Any]:
        """py-spy --nonblocking, else /proc (faulthandler needs the rank to run its handler)."""
        if why_not is None:
            try:
                out = await self.read_pyspy(locals=locals, nonblocking=True)
                return {**out, "stopped": stopped}
            except PermissionError as e:
                self.ptrace_refused, self._refused_at = str(e), time.monotonic()
                why_not = str(e)
            except ReadError as e:
                why_not = str(e)
        return {"route": "proc", "threads": read_proc(self.pid), "gil_holder": None,
                "note": f"{why_not}, and a stopped rank runs no faulthandler", "stopped": stopped}

    async def _read_live(self, *, locals: bool, native: bool) -> dict[str, Any]:
        why_not = self.pyspy_unusable()
        if why_not is None:
            try:
                return await self.read_pyspy(locals=locals, native=native)
            except PermissionError as e:
                self.ptrace_refused, self._refused_at = str(e), time.monotonic()
                why_not = str(e)
                if self.mode == "py-spy":
                    raise ReadError(why_not) from None
            except ReadError as e:
                if self.mode == "py-spy" or self.dump_signal is None:
                    raise
                why_not = str(e)
            print(f"probe watchdog: py-spy not used: {why_not}", file=sys.stderr, flush=True)
        if self.dump_signal is None:
            raise ReadError(f"{why_not}, and the rank has no faulthandler dump signal")
        out = await self.read_faulthandler()
        out["note"] = why_not
        return out

    async def read_pyspy(self, *, locals: bool = False, native: bool = False,
                         nonblocking: bool = False) -> dict[str, Any]:
        """py-spy's dump; ``nonblocking`` reads without suspending the rank (for a stopped
        one, which py-spy cannot suspend; py-spy has no native frames then)."""
        assert self.pyspy
        nonblocking = nonblocking or stop_note(self.pid) is not None
        native = native and not nonblocking
        cmd = [self.pyspy, "dump", "--pid", str(self.pid), "--json"]
        if locals:
            cmd.append("--locals")
        if native:
            cmd.append("--native")
        if nonblocking:
            cmd.append("--nonblocking")
        limit = PYSPY_NATIVE_TIMEOUT_S if native else PYSPY_TIMEOUT_S
        arrived = time.monotonic()
        async with self._pyspy_slots:
            recent = self._recent
            if recent and recent[1] == (locals, native) and recent[0] >= arrived:
                return recent[2]  # a dump that began after we arrived is fresh enough: share it
            began = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
            try:
                out, err = await asyncio.wait_for(proc.communicate(), limit)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
                raise ReadError(f"py-spy did not finish within {limit:g} s") from None
        if proc.returncode != 0:
            text = err.decode(errors="replace").strip().splitlines()
            msg = text[-1] if text else f"exit status {proc.returncode}"
            low = " ".join(text).lower()
            if "permission denied" in low or "operation not permitted" in low:
                raise PermissionError(f"py-spy could not attach: ptrace not permitted ({msg}); in "
                                      "a container add --cap-add=SYS_PTRACE")
            raise ReadError(f"py-spy failed: {msg}")
        try:
            raw = json.loads(out)
        except ValueError:
            raise ReadError("py-spy printed no JSON") from None
        threads = [thread_from_pyspy(t, self.pid) for t in raw if isinstance(t, dict)]
        gil = next((t["thread_id"] for t in threads if t["owns_gil"]), None)
        result = {"route": "py-spy", "threads": threads, "gil_holder": gil}
        self._recent = (began, (locals, native), result)
        return result

    def _handler_installed(self) -> bool:
        """Whether the rank catches the dump signal right now (``SigCgt``). Its default action
        kills, and faulthandler unregisters at interpreter exit: never send it blind."""
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("SigCgt:"):
                        bit = (self.dump_signal or 1) - 1
                        return bool(int(line.split()[1], 16) >> bit & 1)
        except (OSError, ValueError, TypeError):
            return False
        return False

    async def read_faulthandler(self) -> dict[str, Any]:
        assert self.dump_signal is not None
        if self.exiting():
            raise ReadError("the rank is exiting (its faulthandler dump is gone)")
        async with self._dump_lock:
            if not self._handler_installed():
                raise ReadError(f"the rank does not catch signal {self.dump_signal} now (its "
                                "faulthandler dump handler was replaced or removed)")
            try:
                start = os.stat(self.dump_path).st_size
            except OSError as e:
                raise ReadError(f"no faulthandler dump file ({e.strerror})") from None
            try:
                os.kill(self.pid, self.dump_signal)
            except OSError as e:
                raise ReadError(f"could not signal the rank ({e.strerror})") from None
            deadline = time.monotonic() + DUMP_WAIT_S
            size, stable = start, 0
            while time.monotonic() < deadline:
                await asyncio.sleep(0.005)
                new = os.stat(self.dump_path).st_size
                stable = stable + 1 if new == size and new > start else 0
                size = new
                if stable >= 3:  # 15 ms without growth: the handler finished writing
                    break
            if size <= start:
                raise ReadError("the rank wrote no faulthandler dump within "
                                f"{DUMP_WAIT_S:g} s (is its signal handler replaced?)")
            with open(self.dump_path, "rb") as f:
                f.seek(start)
                text = f.read(size - start).decode(errors="replace")
        threads = parse_faulthandler(text, self.names)
        for t in threads:
            t.pop("current", None)
        return {"route": "faulthandler", "threads": threads, "gil_holder": None}
