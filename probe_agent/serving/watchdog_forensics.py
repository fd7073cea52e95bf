"""What the rank leaves on disk for its watchdog to read: faulthandler dumps and the exit record.

- ``<pid>.dump``: every thread's stack, written by faulthandler on a free signal (SIGUSR2, else
  SIGRTMIN+5) that the watchdog sends when the agent does not answer and py-spy cannot read;
- ``<pid>.crash``: the same on a fatal signal (only if the program had not enabled it itself);
- ``<pid>.term``: the same on SIGTERM, chained to the previous action, so a launcher's kill
  still shows where each thread was;
- ``<pid>.exit.json``: the step and the uncaught exception, written at interpreter exit.

Separate from watchdog_link.py, which owns the watchdog *process* (spawning, heartbeat,
restarts, fallback): this module owns the process-wide faulthandler state, which must be
registered once, handed back exactly as found on stop, and dropped in a forked child.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from typing import IO, Any

from probe_protocol.runfiles import RunFiles

from .. import patches


def _free_signal(candidates: list[int]) -> int | None:
    """The first signal nobody handles (Python's view; None = a C handler we must not clobber)."""
    for sig in candidates:
        try:
            if signal.getsignal(sig) == signal.SIG_DFL:
                return sig
        except (ValueError, OSError):
            continue
    return None


class Forensics:
    """The faulthandler registrations and files of one rank (``files`` names them)."""

    def __init__(self, files: RunFiles) -> None:
        self.files = files
        #: The signal the watchdog sends for a dump (its config's ``dump_signal``); None when
        #: every candidate was taken by the program.
        self.dump_signal: int | None = None
        self._files: list[IO[bytes]] = []
        self._registered: list[int] = []
        self._fatal_enabled = False
        self._records: list[patches.Setting] = []

    def register(self) -> None:
        self.dump_signal = _free_signal([signal.SIGUSR2, signal.SIGRTMIN + 5])
        dump = self._open(self.files.dump)
        if self.dump_signal is not None:
            faulthandler.register(self.dump_signal, file=dump, all_threads=True, chain=False)
            self._registered.append(self.dump_signal)
        if not faulthandler.is_enabled():
            faulthandler.enable(file=self._open(self.files.crash), all_threads=True)
            self._fatal_enabled = True
        if _free_signal([signal.SIGTERM]) is not None or callable(
                signal.getsignal(signal.SIGTERM)):
            # chain=True: after the dump the previous action runs: the default one (SIGTERM
            # still kills), or a Python handler (the post-mortem end hooks, which chain on).
            faulthandler.register(signal.SIGTERM, file=self._open(self.files.term),
                                  all_threads=True, chain=True)
            self._registered.append(signal.SIGTERM)
        if self._registered:
            self._records.append(patches.setting(
                "faulthandler.register", ", ".join(signal.Signals(s).name
                                                   for s in self._registered),
                by="watchdog", why="the watchdog's out-of-process backtrace: the signal makes "
                "the rank dump every thread's stack into its run-dir file (SIGTERM chains on)"))
        if self._fatal_enabled:
            self._records.append(patches.setting(
                "faulthandler.enable", self.files.crash, by="watchdog",
                why="a fatal signal (SIGSEGV...) leaves every thread's stack for the report"))

    def _open(self, path: str) -> IO[bytes]:
        f = open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb", buffering=0)
        self._files.append(f)
        return f

    def release_in_child(self) -> None:
        """In a forked child: never dump the child's signals into the rank's files."""
        for sig in self._registered:
            try:
                faulthandler.unregister(sig)
            except (ValueError, RuntimeError):
                pass
        if self._fatal_enabled:
            faulthandler.disable()

    def unregister(self) -> None:
        for sig in self._registered:
            # Only ours to remove while Python still sees the default: a handler the program
            # installed after us must survive.
            if signal.getsignal(sig) == signal.SIG_DFL:
                faulthandler.unregister(sig)
        self._registered.clear()
        if self._fatal_enabled:
            faulthandler.disable()
            self._fatal_enabled = False
        for record in self._records:
            record.done()
        self._records.clear()
        for f in self._files:
            f.close()
        self._files.clear()

    def write_exit_record(self, step: int | None) -> None:
        """``<pid>.exit.json`` for the watchdog that stays to report this exit: the step, and
        the uncaught exception with its traceback if there is one."""
        exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        rec: dict[str, Any] = {"at": time.time(), "step": step, "exception": None}
        if isinstance(exc, BaseException) and not isinstance(exc, SystemExit):
            rec["exception"] = f"{type(exc).__name__}: {exc}"[:500]
            frames = traceback.extract_tb(exc.__traceback__)[::-1]
            rec["traceback"] = [
                {"depth": i, "func": f.name, "file": f.filename, "lineno": f.lineno or 0,
                 "frame_type": "Python", "locals": None} for i, f in enumerate(frames)]
        try:
            with open(os.open(self.files.exit_record, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                              0o600), "w") as f:
                json.dump(rec, f)
        except OSError:
            pass
