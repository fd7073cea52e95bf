"""The ends a rank can see coming: an uncaught exception, SIGTERM, SIGINT, interpreter exit.

Each calls ``on_end(record)`` once (the post-mortem copy writes ``end.json`` and refreshes, in
bounded time), then hands the event on to whoever had it before: the previous
``sys.excepthook``, the job's own signal handler, or the default action (the rank still dies
of its SIGTERM, with the same status). Nothing is swallowed.

A Python signal handler runs only when the main thread runs bytecode; a rank blocked in C (a
collective) would not even die of SIGTERM any more. So when nobody else uses it, the signal
module's wakeup fd is pointed at a pipe that a helper thread (``probe-agent.ends``) reads: it
writes the copy at once and, when the signal's action was the default one and the main thread
has still not run its handler, restores the default disposition (libc ``signal``) and sends
the signal again, so the rank dies of it as it would have without the agent.

Stopped from another thread (an eval, ``probe inject`` detaching), the hooks cannot be undone:
only the main thread may set signal handlers and the wakeup fd. Closing the pipe then would
leave the wakeup fd naming a closed descriptor, so that the next file or socket to get that
number received a byte per signal (and the next agent's start failed on it). So the pipe, its
reader and the handlers stay, inert (``active`` is False: they record nothing and hand every
signal on as before), and the next agent installed from the main thread takes them over
(``_ORPHAN``).

Not seen here: SIGKILL (the watchdog records the death; the copy is at most one refresh old)
and fatal signals such as the process group's SIGABRT on a collective timeout (faulthandler
writes the stacks to ``<pid>.crash``, the watchdog puts them in ``death.json``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from .. import patches
from ..thread_frames import current_frames

SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: The longest an end waits for its copy before the event goes on.
FINAL_WAIT_S = 5.0

#: The hooks of an agent stopped off the main thread, left in place until a main-thread
#: install takes them over (see the module docstring).
_ORPHAN: EndHooks | None = None


def exception_record(exc: BaseException) -> dict[str, Any]:
    frames = traceback.extract_tb(exc.__traceback__)[::-1]
    name = type(exc).__name__
    text = f"{name}: {exc}"[:2000]
    kind = "oom" if name == "OutOfMemoryError" else (
        "nan" if "nan" in str(exc).lower().split() else "exception")
    frames = [f for f in frames if f"{os.sep}probe_agent{os.sep}" not in f.filename]
    return {"kind": kind, "exception": text, "traceback": [
        {"depth": i, "func": f.name, "file": f.filename, "lineno": f.lineno or 0}
        for i, f in enumerate(frames[:64])]}


def stack_of(frame: Any) -> list[dict[str, Any]]:
    """Frames from ``frame`` outwards, innermost first, the agent's own left out, and so is
    what they called (read from another thread while the main thread runs this handler, its
    innermost frames are traceback's and linecache's, which pushed the job's own off the
    frames a verdict shows)."""
    frames = list(traceback.extract_stack(frame)[::-1]) if frame is not None else []

    def ours(f: Any) -> bool:
        return f"{os.sep}probe_agent{os.sep}" in f.filename

    first = next((i for i, f in enumerate(frames) if ours(f)), None)
    if first is not None and all(os.path.basename(f.filename) in _HANDLER_MODULES
                                 for f in frames[:first]):
        end = first
        while end < len(frames) and ours(frames[end]):
            end += 1
        frames = frames[end:]  # the handler's own call chain, innermost
    kept = [f for f in frames if not ours(f)]
    return [{"depth": i, "func": f.name, "file": f.filename, "lineno": f.lineno or 0}
            for i, f in enumerate(kept[:64])]


#: Modules the end handler calls into while it reads a stack (linecache opens a source file
#: through tokenize.open, which reads its encoding: seen as the innermost frames at load).
_HANDLER_MODULES = frozenset({"traceback.py", "linecache.py", "tokenize.py", "codecs.py"})


class EndHooks:
    """Install with ``install()`` (main thread), undo with ``uninstall()``.

    Args:
        on_end: ``on_end(record)``: record has ``kind`` (exit | signal | exception | oom | nan)
            and ``at``; it must return within about FINAL_WAIT_S.
    """

    def __init__(self, on_end: Callable[[dict[str, Any]], None]) -> None:
        self.on_end = on_end
        self.ended: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._prev_hook: Any = None
        self._prev: dict[int, Any] = {}
        self._hook_patch: patches.Patch | None = None
        self._signals: patches.Setting | None = None
        self._handled: dict[int, threading.Event] = {}
        self._pipe: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._written = threading.Event()
        self.active = True

    def after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker) is not the rank: its ends are not recorded,
        and its signals must not reach the parent's helper through the inherited wakeup pipe
        (the parent would take a worker's SIGTERM for its own)."""
        self.active = False
        if self._pipe is None:
            return
        try:
            old = signal.set_wakeup_fd(-1)
            if old != self._pipe[1]:
                signal.set_wakeup_fd(old)
        except ValueError:  # not the main thread
            pass
        for fd in self._pipe:
            os.close(fd)
        self._pipe = None

    def end(self, record: dict[str, Any]) -> None:
        """Record this end once (the first end seen wins: the exit after a SIGTERM is not a
        second end). A second caller waits (bounded) for the first one's copy, so that a
        signal's default action never kills the rank while its copy is being written."""
        if not self.active:
            return
        with self._lock:
            if self.ended is None:
                ended = self.ended = {**record, "at": time.time()}
            else:
                ended = None
        if ended is None:
            self._written.wait(FINAL_WAIT_S)
            return
        try:
            self.on_end(ended)
        finally:
            self._written.set()

    # -- install ----------------------------------------------------------------------------
    def install(self) -> None:
        self._prev_hook = sys.excepthook
        self._hook_patch = patches.replace(
            sys, "excepthook", self._excepthook, by="post-mortem",
            why="records how the rank ended (the exception) before the previous hook runs")
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        orphan = _ORPHAN
        for sig in SIGNALS:
            prev = signal.getsignal(sig)
            if orphan is not None and prev == orphan._on_signal:
                prev = orphan._prev.get(sig, signal.SIG_DFL)  # what it handed on to
            if prev in (signal.SIG_IGN, None):
                continue  # ignored, or a C handler we cannot chain to
            self._prev[sig] = prev
            self._handled[sig] = threading.Event()
            signal.signal(sig, self._on_signal)
        if self._prev:
            self._signals = patches.setting(
                "signal handlers", ", ".join(signal.Signals(s).name for s in self._prev),
                by="post-mortem", why="records a fatal signal, then hands it to the handler "
                "that was there (or the default action)")
        self._watch_wakeup()

    def _watch_wakeup(self) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:
            old = None
        orphan = _ORPHAN
        if orphan is not None and orphan._pipe is not None and old == orphan._pipe[1]:
            old = -1  # a stopped agent's, left for us: ours now
            orphan._retire()
        if old != -1:  # someone (an asyncio loop) uses it: theirs stays
            if old is not None:
                signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return
        self._pipe = (r, w)
        self._thread = threading.Thread(target=self._read_wakeups, name="probe-agent.ends",
                                        daemon=True)
        self._thread.start()

    def uninstall(self) -> None:
        global _ORPHAN
        patches.restore(self._hook_patch)
        self.active = False
        if threading.current_thread() is not threading.main_thread():
            if self._prev or self._pipe is not None:
                _ORPHAN = self  # inert, in place, until a main-thread install takes over
                if self._thread is not None:
                    self._thread.name = "probe-ends-orphan"  # not the agent's any more
            return
        for sig, prev in self._prev.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, prev)
        if self._signals is not None:
            self._signals.done()
        if self._pipe is not None:
            old = signal.set_wakeup_fd(-1)
            if old != self._pipe[1]:
                signal.set_wakeup_fd(old)  # someone else's since: theirs stays
        self._retire()
        self._prev.clear()

    def _retire(self) -> None:
        """Close the pipe (its reader sees the end and returns); the wakeup fd is not ours."""
        global _ORPHAN
        if self._pipe is not None:
            os.close(self._pipe[1])
            if self._thread is not None:
                self._thread.join(1.0)
            os.close(self._pipe[0])
            self._pipe = None
        if _ORPHAN is self:
            _ORPHAN = None

    # -- the ends ---------------------------------------------------------------------------
    def _excepthook(self, tp: type[BaseException], exc: BaseException, tb: Any) -> None:
        try:
            if not isinstance(exc, SystemExit):
                self.end(exception_record(exc))
        finally:
            (self._prev_hook or sys.__excepthook__)(tp, exc, tb)

    def _signal_record(self, sig: int, frame: Any) -> dict[str, Any]:
        """The signal, and where the main thread was when it came (``frame``: the frame it
        interrupted, or the main thread's current one when it is blocked in C)."""
        return {"kind": "signal", "signal": int(sig), "signal_name": signal.Signals(sig).name,
                # Python's handlers do not get siginfo: the sender stays unknown here.
                "sender": None, "stack": stack_of(frame)}

    def _on_signal(self, sig: int, frame: Any) -> None:
        self._handled.get(sig, threading.Event()).set()
        self.end(self._signal_record(sig, frame))
        prev = self._prev.get(sig, signal.SIG_DFL)
        if callable(prev):
            prev(sig, frame)  # the job's own handler (KeyboardInterrupt for SIGINT)
        elif prev == signal.SIG_DFL:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)

    def _read_wakeups(self) -> None:
        assert self._pipe is not None
        while True:
            try:
                data = os.read(self._pipe[0], 64)
            except OSError:
                return
            if not data:
                return
            for sig in set(data):
                if sig in self._handled:
                    threading.Thread(target=self._off_main, args=(sig,), daemon=True,
                                     name="probe-agent.ends-signal").start()

    def _off_main(self, sig: int) -> None:
        """The signal arrived; write the copy now, whatever the main thread is doing. If its
        action is the default one and the main thread has not handled it by then (blocked in
        C), carry out the default action from here."""
        main = current_frames().get(threading.main_thread().ident or 0)
        self.end(self._signal_record(sig, main))
        if self._handled[sig].wait(0.5) or self._prev.get(sig) != signal.SIG_DFL:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal(int(sig), 0)  # SIG_DFL, without the main-thread rule of signal.signal
        os.kill(os.getpid(), sig)
