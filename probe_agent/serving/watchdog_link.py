"""The agent's side of the watchdog (runs inside the rank; see the package docstring).

``WatchdogLink.create(...)`` (agent.py passes what it uses) binds the private socket the
agent then serves. ``start()`` (after the agent's server runs) registers the faulthandler
dumps, spawns the watchdog with the public listening sockets and grants it ptrace (Yama),
and starts ``probe-agent.watchdog``, which waits on the watchdog process and writes the
heartbeat meanwhile. If it dies while the rank lives, that thread starts a new one
(``watchdog_restarts.py``), logging one line each time; ``describe()``
(``probe info``) counts the restarts. A watchdog that keeps dying is given up on, and the agent
serves the public sockets itself again.

``stop()`` has two cases. An explicit ``probe_agent.stop()`` ends the watchdog and removes its
files. At interpreter exit (the main thread has already finished) it writes ``<pid>.exit.json``
(with the uncaught exception, if any) and leaves the watchdog running, to report the death.
The faulthandler dumps and the exit record themselves are ``watchdog_forensics.py``'s.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Set
from typing import Any

from probe_protocol.runfiles import RunFiles

from .. import heapscan
from ..clock import StepClock
from ..config import AgentConfig
from ..errors import BindError
from ..profiling.pyspy import find_pyspy
from ..ranks import Identity
from ..watchdog import beat
from .server import bind_unix, close_sockets
from .watchdog_check import WatchdogCheck
from .watchdog_forensics import Forensics
from .watchdog_restarts import DELIBERATE, RESTART_WINDOW_S, Restarts, supervise

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 10.0
PR_SET_PTRACER = 0x59616D61


def grant_ptrace(pid: int) -> None:
    """Yama ptrace_scope=1 lets only ancestors trace us: name the watchdog as our tracer."""
    if not os.path.exists("/proc/sys/kernel/yama/ptrace_scope"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PTRACER, pid, 0, 0, 0) != 0:
        log.warning("probe agent: prctl(PR_SET_PTRACER) failed (errno %d); the watchdog may "
                    "not read stacks with py-spy", ctypes.get_errno())


#: Starts a server in this process on (plain sockets, TLS sockets): the fallback when the
#: watchdog cannot serve the public sockets. Returns something with ``stop()``.
ServeFallback = Callable[[list[socket.socket], list[socket.socket]], Any]


class WatchdogLink:
    """The rank's side of its watchdog.

    Args:
        config: the agent's; the run dir, token, TLS and the watchdog's own settings.
        identity: who this rank is; ``rank`` is updated by the agent when the process group
            renumbers it.
        clock: the step clock; its step goes into every heartbeat and the exit record.
        host_names: the names the access rule accepts (``access.Policy.host_names``); the
            watchdog applies the same rule.
        public: the listening sockets the watchdog will own.
        serve_fallback: starts an in-process server on the public sockets, used when the
            watchdog cannot start or keeps dying.
    """

    def __init__(self, config: AgentConfig, identity: Identity, clock: StepClock,
                 host_names: Set[str], public: list[socket.socket],
                 serve_fallback: ServeFallback) -> None:
        self.config = config
        self.identity = identity
        self.rank = identity.rank
        self.clock = clock
        self.host_names = host_names
        self.serve_fallback = serve_fallback
        self.files = RunFiles(config.run_dir, identity.pid)
        self.public = public
        self.inner_socket, self.inner_path = bind_unix(
            config.run_dir, identity.pid, identity.rank, name=self.files.inner_name)
        self.proc: subprocess.Popen[bytes] | None = None
        self.pyspy = find_pyspy()
        self.forensics = Forensics(self.files)
        self._beat_fd: int | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._fallback: Any = None
        self._fallback_starting = False
        self._check: WatchdogCheck | None = None  # is the living watchdog serving?
        self._busy_until_ns = 0  # the heartbeat's busy_until (busy())
        self._seq = itertools.count()
        self._unsubscribe: Any = None
        self.stopping = False
        self.restarts = Restarts()
        # Held while a new watchdog starts, so stop() never misses one being born.
        self._spawning = threading.Lock()

    @classmethod
    def create(cls, config: AgentConfig, identity: Identity, clock: StepClock,
               host_names: Set[str], public: list[socket.socket],
               serve_fallback: ServeFallback) -> WatchdogLink | None:
        try:
            return cls(config, identity, clock, host_names, public, serve_fallback)
        except BindError as e:
            log.warning("probe agent: no watchdog (%s); serving without it", e)
            return None

    # -- start ------------------------------------------------------------------------------
    def start(self) -> None:
        self.forensics.register()
        self._beat_fd = os.open(self.files.beat, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        beat.write(self._beat_fd, next(self._seq), self._step())
        heapscan.busy_hook = self.busy  # a heap walk holds the GIL on purpose: say so
        # Exact last step for crash reports: one 32-byte pwrite per step (~2 us).
        self._unsubscribe = self.clock.subscribe(self._on_step, name="watchdog heartbeat")
        try:
            self._spawn()
        except (OSError, RuntimeError) as e:
            log.warning("probe agent on rank %d: watchdog did not start (%s); serving its "
                        "sockets in-process, without the out-of-process backtrace",
                        self.rank, e)
            self._serve_in_process()
            return
        # NOTE: this thread may still run at interpreter exit (the watchdog stays to report
        # the death, and the thread ends only once stop() has run), so it must not hold the
        # link across a wait (neither as its target nor in its frame): through serve_fallback
        # it would keep the DuckDB connection alive at finalization, and duckdb's nanobind then
        # prints "leaked 28 instances" on every training exit.
        self._spawn_thread("probe-agent.watchdog", supervise,
                           (self.proc, weakref.ref(self), self._stop))

    def _spawn_thread(self, name: str, target: Any, args: tuple[Any, ...] = ()) -> None:
        th = threading.Thread(target=target, args=args, name=name, daemon=True)
        th.start()
        self._threads.append(th)

    def _spawn(self) -> None:
        cfg = self.config
        tcp = next((s for s in self.public if s.family != socket.AF_UNIX), None)
        uds = next((s for s in self.public if s.family == socket.AF_UNIX), None)
        conf = {
            "pid": self.identity.pid, "rank": self.rank,
            "hostname": self.identity.host, "run_dir": cfg.run_dir,
            "inner_path": self.inner_path, "token": cfg.token,
            "tcp_fd": tcp.fileno() if tcp else None, "uds_fd": uds.fileno() if uds else None,
            "host": tcp.getsockname()[0] if tcp else None,
            "port": tcp.getsockname()[1] if tcp else None,
            "pyspy": self.pyspy, "reader": cfg.watchdog_reader,
            "dump_signal": self.forensics.dump_signal,
            "deadline_ms": cfg.backtrace_deadline_ms, "grace_s": cfg.watchdog_grace_s,
            "snapshot_s": cfg.watchdog_snapshot_s,
            "postmortem_keep": cfg.postmortem == "always",
            "tls_cert": cfg.tls_cert, "tls_key": cfg.tls_key,
            # the same access rule as the agent's (access.Policy), host names included.
            "host_names": sorted(self.host_names),
        }
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        # Without TLS, OpenSSL is kept out: asyncio runs without ssl, and hashlib/hmac (token
        # checks: sha256, compare_digest) fall back to Python's own sha256 without _hashlib.
        # libssl and libcrypto were 5 MiB of the watchdog's 22.6 MiB RSS.
        no_ssl = "" if cfg.tls_cert else "sys.modules['ssl'] = sys.modules['_hashlib'] = None; "
        boot = (f"import sys; {no_ssl}sys.path.insert(0, {root!r}); "
                "from probe_agent.watchdog.main import main; main()")
        fds = [s.fileno() for s in self.public]
        with open(self.files.log, "ab") as logf:
            # -I -S: no site, no user paths, no PYTHON* variables: starts in ~20 ms, imports
            # nothing of the training environment. A new session: a launcher's killpg of the
            # job must not take the forensics with it.
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", boot], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=logf, pass_fds=fds, start_new_session=True,
                close_fds=True)
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(conf).encode())
        self.proc.stdin.close()
        grant_ptrace(self.proc.pid)
        ready, _, _ = select.select([self.proc.stdout], [], [], READY_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else b""
        self.proc.stdout.close()
        if line.strip() != b"ready":
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"no ready signal within {READY_TIMEOUT_S:g} s; see "
                               f"{self.files.log}")

    # -- threads ----------------------------------------------------------------------------
    def _step(self) -> int | None:
        return self.clock.current_step if self.clock.seen_step else None

    def heartbeat(self) -> None:
        """One beat (``probe-agent.watchdog`` calls it every ``beat.INTERVAL_S`` while it waits
        on the watchdog process); none once stopping, so none follows the exit record."""
        fd = self._beat_fd
        if fd is None or self._stop.is_set():
            return
        try:
            beat.write(fd, next(self._seq), self._step(), self._busy_until_ns)
        except OSError:
            pass

    def _on_step(self, step: int, _optimizer: Any) -> None:
        fd = self._beat_fd
        if fd is not None:
            beat.write(fd, next(self._seq), step, self._busy_until_ns)

    def busy(self, seconds: float) -> None:
        """The rank's Python will hold the GIL on purpose for up to ``seconds`` (0: no longer):
        said in the heartbeat, so the watchdog waits for the answer instead of a 504
        (heapscan.busy_hook)."""
        self._busy_until_ns = time.monotonic_ns() + int(seconds * 1e9) if seconds > 0 else 0
        fd = self._beat_fd
        if fd is not None and not self._stop.is_set():
            try:
                beat.write(fd, next(self._seq), self._step(), self._busy_until_ns)
            except OSError:
                pass

    def check_watchdog(self, proc: subprocess.Popen[bytes]) -> str | None:
        """Why the living watchdog ``proc`` must be taken over (stopped, hung), or None; on
        the ``probe-agent.watchdog`` thread, between heartbeats (never blocks)."""
        if self._check is None or self._check.pid != proc.pid:
            if self._check is not None:
                self._check.close()
            uds = next((s for s in self.public if s.family == socket.AF_UNIX), None)
            path = uds.getsockname() if uds is not None else None
            self._check = WatchdogCheck(proc.pid, path if isinstance(path, str) else None)
        why = self._check.tick()
        if why is not None:
            log.warning("probe agent on rank %d: the watchdog (pid %d) is %s; killing it and "
                        "starting a new one on the same sockets", self.rank, proc.pid, why)
        return why

    def _watchdog_exited(self, why: str) -> float | None:
        """Record a death; the seconds to wait before restarting, or None for no restart (we
        are stopping, or it died too often and the in-process fallback now serves)."""
        if self.stopping or self._stop.is_set():
            return None
        if why in DELIBERATE:
            # SIGTERM is how a watchdog is stopped on purpose (main.py): the job tearing down
            # its processes (Lightning's SIGTERM handling, a launcher's kill of the tree). A
            # restart then outlived the job by the whole grace; the sockets are served here.
            self.restarts.died(why)
            log.warning("probe agent on rank %d: the watchdog was stopped (%s); not restarted, "
                        "serving the public sockets in-process", self.rank, why)
            self._serve_in_process()
            return None
        delay = self.restarts.died(why)
        if delay is None:
            log.warning("probe agent on rank %d: the watchdog died %d times within %g s (last: "
                        "%s); serving the public sockets in-process from now on, without the "
                        "out-of-process backtrace; see %s", self.rank, self.restarts.recent,
                        RESTART_WINDOW_S, why, self.files.log)
            self._serve_in_process()
        return delay

    def _respawn(self) -> tuple[subprocess.Popen[bytes] | None, str | None]:
        """Start a new watchdog on the same sockets: (its process, None), (None, why it did
        not start), or (None, None) when the agent is stopping."""
        old = self.proc.pid if self.proc is not None else None
        with self._spawning:
            if self.stopping or self._stop.is_set():
                return None, None
            try:
                self._spawn()
            except (OSError, RuntimeError) as e:
                return None, f"its restart failed ({e})"
        self.restarts.count += 1
        assert self.proc is not None
        log.warning("probe agent on rank %d: the watchdog (pid %s) died (%s); restarted it as "
                    "pid %d (restart %d; `probe info` shows them)", self.rank, old,
                    self.restarts.last_death, self.proc.pid, self.restarts.count)
        return self.proc, None

    def _serve_in_process(self) -> None:
        tls = self.config.tls
        tcp = [s for s in self.public if s.family != socket.AF_UNIX]
        plain = [s for s in self.public if s.family == socket.AF_UNIX] if tls else self.public
        # The watchdog held the TLS of the TCP port; in-process, uvicorn must take it over.
        # Said before it starts: the fallback answers requests (its own /v1/info among them)
        # before serve_fallback returns.
        self._fallback_starting = True
        try:
            self._fallback = self.serve_fallback(list(plain), tcp if tls else [])
        finally:
            self._fallback_starting = False

    def describe(self) -> dict[str, Any]:
        alive = self.proc is not None and self.proc.poll() is None
        return {
            "pid": self.proc.pid if alive and self.proc else None,
            "reader": self.config.watchdog_reader, "pyspy": self.pyspy,
            "dump_signal": (signal.Signals(self.forensics.dump_signal).name
                            if self.forensics.dump_signal else None),
            "in_process_fallback": self._fallback is not None or self._fallback_starting,
            # Stopped by a debugger (ptrace): not serving, and left alone (watchdog_check.py).
            "debugger_stop": bool(self._check and alive and self._check.debugger_stop),
            **self.restarts.describe(),
        }

    def after_fork_in_child(self) -> None:
        """In a forked child (a DataLoader worker): let go of the public port, and never dump
        the child's SIGTERM into the rank's forensics. The agent's fork handler calls this."""
        self._stop.set()
        close_sockets(self.public)
        self.forensics.release_in_child()
        self.proc = None

    # -- stop -------------------------------------------------------------------------------
    def stop(self) -> bool:
        """Stop; True when the watchdog stays to report this process's exit (the caller must
        then leave ``<pid>.sock`` and ``<pid>.json`` in place)."""
        exiting = not threading.main_thread().is_alive()
        self.stopping = True
        self._stop.set()
        if heapscan.busy_hook == self.busy:
            heapscan.busy_hook = None
        with self._spawning:  # a watchdog being restarted right now is stopped below too
            pass
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for th in self._threads:  # its last heartbeat is written before the exit record
            th.join(2.0)
        handover = exiting and self.proc is not None and self.proc.poll() is None
        if handover:
            self.forensics.write_exit_record(self._step())
        elif self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(3.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for th in self._threads:
            th.join(2.0)
        if self._fallback is not None:
            self._fallback.stop()
        close_sockets(self.public)  # the inner socket is the agent server's to close
        if handover:
            return True  # leave the dump registrations: a SIGTERM now is still worth a stack
        self.forensics.unregister()
        if self._beat_fd is not None:
            os.close(self._beat_fd)
            self._beat_fd = None
        for path in (self.inner_path, self.files.log, *self.files.forensic_files()):
            if path == self.files.log and _nonempty(path):
                continue
            try:
                os.unlink(path)
            except OSError:
                pass
        return False


def _nonempty(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False
