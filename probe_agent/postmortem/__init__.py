"""The post-mortem copy of one rank (see copy.py, ends.py; layout in probe_protocol/postmortem.py).

``Postmortem`` wires the copy, the end hooks and the sweep of old directories; the agent builds
it (agent.py) and hands it what it uses. At start it sweeps old job directories, starts the
refresh thread, installs the end hooks and leaves ``<pid>.postmortem`` in the run dir (the path
of this rank's directory) for the watchdog, which records the death there. ``close`` at the
agent's stop: one last copy, and a clean end removes the directory unless PROBE_POSTMORTEM=always
(at interpreter exit with a watchdog, the watchdog decides: it knows the exit status).

Where: only under a root nobody else controls, and only proven copies are swept or removed
(probe_protocol/owned_tree.py). Named per run: a run the launcher did not name starts under its
launcher's name and moves once to the name its ranks agree on in the job's store (launch.py).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from probe_protocol import owned_tree
from probe_protocol import postmortem as layout
from probe_protocol.runfiles import RunFiles

from . import launch
from .copy import PostmortemCopy
from .ends import FINAL_WAIT_S, EndHooks
from .sweep import sweep

log = logging.getLogger(__name__)


class Postmortem:
    def __init__(self, store: Any, *, root: str, job: str, rank: int, run_dir: str | None,
                 pid: int, every_s: float, budget_mb: int, keep: bool,
                 meta: Callable[[], dict[str, Any]], offer: str | None = None) -> None:
        self.root = root
        self.job = job
        self.rank = rank
        self.keep = keep
        self.path = layout.rank_dir(root, job, rank)
        self.pointer = RunFiles(run_dir, pid).postmortem if run_dir else None
        self.copy = PostmortemCopy(store, self.path, lambda: {"job": self.job, **meta()},
                                   every_s, budget_mb * 1024 * 1024)
        self.hooks = EndHooks(self._on_end)
        #: A run the launcher did not name: its ranks agree on one name (launch.py).
        self._offer = offer
        self._agree_failures = 0
        if offer is not None:  # "" too: a process that started with no rendezvous
            self.copy.before = self._agree
        #: called at the end for more of the rank's last state (agent.py: its last
        #: collectives, as the recorder sees them then; the table copy may not get that far)
        self.end_extra: Callable[[], dict[str, Any]] | None = None

    def start(self) -> None:
        try:
            removed = sweep(self.root, keep=self.job)
            if removed:
                log.info("probe agent: removed %d old post-mortem directories from %s",
                         len(removed), self.root)
            owned_tree.make_copy_dir(self.path)
        except OSError as e:  # a root someone else could change, among others: one line
            log.warning("probe agent: no post-mortem copy (%s)", e)
            return
        self._write_pointer()
        self.copy.start()
        self.hooks.install()

    def _write_pointer(self) -> None:
        if self.pointer is not None:
            try:
                layout.write_atomic(self.pointer, lambda f: f.write(self.path.encode()))
            except OSError:
                pass

    def _agree(self) -> None:
        """Before each refresh until done: the name every rank of the run agreed on (the first
        offer in the job's store), and this rank's directory moved there unless it is already
        (every rank but the one whose offer won moves once, when the process group is up)."""
        if self._offer is None or self.hooks.ended is not None:
            return  # at an end the copy goes where it is: no store call then
        try:
            job = launch.agree(self._offer)
        except Exception as e:  # the store is down or slow: a few tries, then our own name
            self._agree_failures += 1
            if self._agree_failures >= 3:
                self._offer = None
                log.warning("probe agent: post-mortem copy stays in %s (the job's store did "
                            "not answer: %s)", self.path, e)
            return
        if job is None:
            return
        self._offer = None
        if job != self.job:
            new = layout.rank_dir(self.root, job, self.rank)
            try:
                owned_tree.move_rank_copy(self.path, new)
            except OSError as e:
                log.warning("probe agent: post-mortem copy stays in %s (%s)", self.path, e)
                return
            self.job, self.path, self.copy.path = job, new, new
            self._write_pointer()

    def _on_end(self, record: dict[str, Any]) -> None:
        if self.end_extra is not None:
            try:
                record = {**record, **self.end_extra()}
            except Exception as e:  # noqa: BLE001 - the end record must be written anyway
                log.debug("probe agent: end extras failed: %s", e)
        try:
            # named without waiting on an fsync: the rank may be SIGKILLed within seconds
            layout.write_json(os.path.join(self.path, layout.END), record, durable=False)
        except OSError:
            pass
        self.copy.refresh_soon(FINAL_WAIT_S)

    def close(self, exiting: bool, watchdog_stays: bool) -> None:
        """The agent stops. At interpreter exit: a last copy and an ``exit`` end unless an
        earlier end was seen. A clean end removes the directory unless kept; with a watchdog
        staying to report the death, the watchdog decides (it sees the exit status)."""
        if exiting:
            self.hooks.end({"kind": "exit"})
        self.copy.stop()
        clean = (self.hooks.ended or {"kind": "exit"}).get("kind") == "exit"
        if not (exiting and watchdog_stays):
            if clean and not self.keep:
                owned_tree.remove_rank_copy(self.path)
            if self.pointer is not None:
                try:
                    os.unlink(self.pointer)
                except OSError:
                    pass

    def release(self) -> None:
        """Give the signals and the excepthook back (an explicit stop; after the watchdog's
        own SIGTERM dump is unregistered, which chains to ours). At interpreter exit they stay:
        a late SIGTERM still reaches the job's handler through them."""
        self.hooks.uninstall()

    def after_fork_in_child(self) -> None:
        self.hooks.after_fork_in_child()

    def describe(self) -> dict[str, Any]:
        c = self.copy
        return {"path": self.path, "every_s": c.every_s, "budget_bytes": c.budget_bytes,
                "refreshes": c.refreshes, "refreshed_at": c.refreshed_at,
                "bytes_written": c.bytes_written, "last_refresh_s": round(c.last_refresh_s, 4),
                "truncated": c.dropped_bytes > 0, "now": time.time()}
