"""The agent's side of the watchdog (runs inside the rank; see the package docstring).

``WatchdogLink.create(agent, public_sockets)`` binds the private socket the agent then serves.
``start()`` (after the agent's server runs) registers the faulthandler dumps, starts the
``probe-agent.heartbeat`` thread, spawns the watchdog with the public listening sockets and
grants it ptrace (Yama), and starts ``probe-agent.watchdog``, which waits on the watchdog
process. If it dies while the rank lives, that thread starts a new one
(``watchdog_restarts.py``, issue 20), logging one line each time; ``describe()``
(``probe info``) counts the restarts. A watchdog that keeps dying is given up on, and the agent
serves the public sockets itself again.

``stop()`` has two cases. An explicit ``probe_agent.stop()`` ends the watchdog and removes its
files. At interpreter exit (the main thread has already finished) it writes ``<pid>.exit.json``
(with the uncaught exception, if any) and leaves the watchdog running, to report the death.
"""

from __future__ import annotations

import faulthandler
import itertools
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
import weakref
from typing import IO, TYPE_CHECKING, Any

from ..watchdog import beat
from ..watchdog.files import RunFiles
from .server import AgentServer, bind_unix, close_sockets
from .watchdog_restarts import RESTART_WINDOW_S, Restarts, supervise

if TYPE_CHECKING:
    from ..agent import Agent

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 10.0
PR_SET_PTRACER = 0x59616D61
_links: weakref.WeakSet[WatchdogLink] = weakref.WeakSet()
_fork_hook = False


def find_pyspy() -> str | None:
    """PROBE_PYSPY, then py-spy next to this interpreter (a venv), then PATH."""
    for cand in (os.environ.get("PROBE_PYSPY"),
                 os.path.join(os.path.dirname(sys.executable), "py-spy"),
                 os.path.join(sysconfig.get_path("scripts"), "py-spy"),
                 shutil.which("py-spy")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _free_signal(candidates: list[int]) -> int | None:
    """The first signal nobody handles (Python's view; None = a C handler we must not clobber)."""
    for sig in candidates:
        try:
            if signal.getsignal(sig) == signal.SIG_DFL:
                return sig
        except (ValueError, OSError):
            continue
    return None


def grant_ptrace(pid: int) -> None:
    """Yama ptrace_scope=1 lets only ancestors trace us: name the watchdog as our tracer."""
    if not os.path.exists("/proc/sys/kernel/yama/ptrace_scope"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PTRACER, pid, 0, 0, 0) != 0:
        log.warning("probe agent: prctl(PR_SET_PTRACER) failed (errno %d); the watchdog may "
                    "not read stacks with py-spy", ctypes.get_errno())


def reclaim_port(run_dir: str, port: int, timeout: float = 2.0) -> bool:
    """Ask the watchdogs of *dead* ranks that still hold ``port`` to let go (a restarted rank
    wants its port back); True when one was asked and has let go."""
    asked = []
    try:
        names = [n for n in os.listdir(run_dir) if n.endswith(".watchdog.json")]
    except OSError:
        return False
    for name in names:
        try:
            with open(os.path.join(run_dir, name)) as f:
                rec = json.load(f)
            if rec.get("state") == "dead" and rec.get("port") == port:
                os.kill(int(rec["watchdog_pid"]), signal.SIGUSR1)
                asked.append(os.path.join(run_dir, name))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    deadline = time.monotonic() + timeout
    while asked and time.monotonic() < deadline:
        time.sleep(0.02)
        still = []
        for path in asked:
            try:
                with open(path) as f:
                    if json.load(f).get("port") == port:
                        still.append(path)
            except (OSError, ValueError):
                pass
        if not still:
            return True
        asked = still
    return False


class WatchdogLink:
    def __init__(self, agent: Agent, public: list[socket.socket]) -> None:
        self.agent = agent
        cfg = agent.config
        self.files = RunFiles(cfg.run_dir, agent.identity.pid)
        self.public = public
        self.inner_socket, self.inner_path = bind_unix(
            cfg.run_dir, agent.identity.pid, agent.rank, name=self.files.inner_name)
        self.proc: subprocess.Popen[bytes] | None = None
        self.pyspy = find_pyspy()
        self.dump_signal: int | None = None
        self._files: list[IO[bytes]] = []
        self._registered: list[int] = []
        self._fatal_enabled = False
        self._beat_fd: int | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._fallback: Any = None
        self._seq = itertools.count()
        self._unsubscribe: Any = None
        self.stopping = False
        self.restarts = Restarts()
        # Held while a new watchdog starts, so stop() never misses one being born.
        self._spawning = threading.Lock()

    @classmethod
    def create(cls, agent: Agent, public: list[socket.socket]) -> WatchdogLink | None:
        from ..errors import BindError

        try:
            return cls(agent, public)
        except BindError as e:
            log.warning("probe agent: no watchdog (%s); serving without it", e)
            return None

    # -- start ------------------------------------------------------------------------------
    def start(self) -> None:
        global _fork_hook
        _links.add(self)
        if not _fork_hook:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook = True
        self._register_dumps()
        self._beat_fd = os.open(self.files.beat, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        beat.write(self._beat_fd, next(self._seq), self._step())
        self._spawn_thread("probe-agent.heartbeat", self._beat_loop)
        clock = getattr(self.agent, "stepclock", None)
        if clock is not None and hasattr(clock, "subscribe"):
            # Exact last step for crash reports: one 32-byte pwrite per step (~2 us).
            self._unsubscribe = clock.subscribe(self._on_step, name="watchdog heartbeat")
        try:
            self._spawn()
        except (OSError, RuntimeError) as e:
            log.warning("probe agent on rank %d: watchdog did not start (%s); serving its "
                        "sockets in-process, without the out-of-process backtrace",
                        self.agent.rank, e)
            self._serve_in_process()
            return
        # NOTE: this thread outlives interpreter exit when the watchdog stays to report the
        # death (handover), so it must not hold the link (neither as its target nor in its
        # frame): through link.agent it would keep the DuckDB connection alive at finalization,
        # and duckdb's nanobind then prints "leaked 28 instances" on every training exit.
        self._spawn_thread("probe-agent.watchdog", supervise,
                           (self.proc, weakref.ref(self), self._stop))

    def _spawn_thread(self, name: str, target: Any, args: tuple[Any, ...] = ()) -> None:
        th = threading.Thread(target=target, args=args, name=name, daemon=True)
        th.start()
        self._threads.append(th)

    def _register_dumps(self) -> None:
        self.dump_signal = _free_signal([signal.SIGUSR2, signal.SIGRTMIN + 5])
        dump = self._open(self.files.dump)
        if self.dump_signal is not None:
            faulthandler.register(self.dump_signal, file=dump, all_threads=True, chain=False)
            self._registered.append(self.dump_signal)
        if not faulthandler.is_enabled():
            faulthandler.enable(file=self._open(self.files.crash), all_threads=True)
            self._fatal_enabled = True
        if _free_signal([signal.SIGTERM]) is not None:
            # chain=True: after the dump the default action runs, so SIGTERM still kills.
            faulthandler.register(signal.SIGTERM, file=self._open(self.files.term),
                                  all_threads=True, chain=True)
            self._registered.append(signal.SIGTERM)

    def _open(self, path: str) -> IO[bytes]:
        f = open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb", buffering=0)
        self._files.append(f)
        return f

    def _spawn(self) -> None:
        cfg = self.agent.config
        tcp = next((s for s in self.public if s.family != socket.AF_UNIX), None)
        uds = next((s for s in self.public if s.family == socket.AF_UNIX), None)
        conf = {
            "pid": self.agent.identity.pid, "rank": self.agent.rank,
            "hostname": self.agent.identity.host, "run_dir": cfg.run_dir,
            "inner_path": self.inner_path, "token": cfg.token,
            "tcp_fd": tcp.fileno() if tcp else None, "uds_fd": uds.fileno() if uds else None,
            "host": tcp.getsockname()[0] if tcp else None,
            "port": tcp.getsockname()[1] if tcp else None,
            "pyspy": self.pyspy, "reader": cfg.watchdog_reader, "dump_signal": self.dump_signal,
            "deadline_ms": cfg.backtrace_deadline_ms, "grace_s": cfg.watchdog_grace_s,
            "snapshot_s": cfg.watchdog_snapshot_s,
            "tls_cert": cfg.tls_cert, "tls_key": cfg.tls_key,
            # issue 19: the same access rule as the agent's (access.Policy), host names included.
            "host_names": sorted(self.agent.gate.policy.host_names),
        }
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        boot = (f"import sys; sys.path.insert(0, {root!r}); "
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
        clock = getattr(self.agent, "stepclock", None)
        if clock is None or not getattr(clock, "seen_step", False):
            return None
        return getattr(clock, "current_step", None)

    def _beat_loop(self) -> None:
        while not self._stop.wait(beat.INTERVAL_S):
            try:
                beat.write(self._beat_fd, next(self._seq), self._step())  # type: ignore[arg-type]
            except (OSError, TypeError):
                return

    def _on_step(self, step: int, _optimizer: Any) -> None:
        fd = self._beat_fd
        if fd is not None:
            beat.write(fd, next(self._seq), step)

    def _watchdog_exited(self, why: str) -> float | None:
        """Record a death; the seconds to wait before restarting, or None for no restart (we
        are stopping, or it died too often and the in-process fallback now serves)."""
        if self.stopping or self._stop.is_set():
            return None
        delay = self.restarts.died(why)
        if delay is None:
            log.warning("probe agent on rank %d: the watchdog died %d times within %g s (last: "
                        "%s); serving the public sockets in-process from now on, without the "
                        "out-of-process backtrace; see %s", self.agent.rank, self.restarts.recent,
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
                    "pid %d (restart %d; `probe info` shows them)", self.agent.rank, old,
                    self.restarts.last_death, self.proc.pid, self.restarts.count)
        return self.proc, None

    def _serve_in_process(self) -> None:
        from .app import create_app

        cfg = self.agent.config
        tcp = [s for s in self.public if s.family != socket.AF_UNIX]
        plain = [s for s in self.public if s.family == socket.AF_UNIX] if cfg.tls else self.public
        # The watchdog held the TLS of the TCP port; in-process, uvicorn must take it over.
        self._fallback = AgentServer(create_app(self.agent), list(plain), self.agent.rank,
                                     self.agent.gate, tls_sockets=tcp if cfg.tls else [],
                                     tls=cfg)
        self._fallback.start()

    def describe(self) -> dict[str, Any]:
        alive = self.proc is not None and self.proc.poll() is None
        return {
            "pid": self.proc.pid if alive and self.proc else None,
            "reader": self.agent.config.watchdog_reader, "pyspy": self.pyspy,
            "dump_signal": signal.Signals(self.dump_signal).name if self.dump_signal else None,
            "in_process_fallback": self._fallback is not None,
            **self.restarts.describe(),
        }

    # -- stop -------------------------------------------------------------------------------
    def stop(self) -> bool:
        """Stop; True when the watchdog stays to report this process's exit (the caller must
        then leave ``<pid>.sock`` and ``<pid>.json`` in place)."""
        exiting = not threading.main_thread().is_alive()
        self.stopping = True
        self._stop.set()
        with self._spawning:  # a watchdog being restarted right now is stopped below too
            pass
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for th in self._threads:
            if th.name == "probe-agent.heartbeat":
                th.join(2.0)
        handover = exiting and self.proc is not None and self.proc.poll() is None
        if handover:
            self._write_exit_record()
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
        self._unregister_dumps()
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

    def _unregister_dumps(self) -> None:
        for sig in self._registered:
            # Only ours to remove while Python still sees the default: a handler the program
            # installed after us must survive.
            if signal.getsignal(sig) == signal.SIG_DFL:
                faulthandler.unregister(sig)
        self._registered.clear()
        if self._fatal_enabled:
            faulthandler.disable()
            self._fatal_enabled = False
        for f in self._files:
            f.close()
        self._files.clear()

    def _write_exit_record(self) -> None:
        exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        rec: dict[str, Any] = {"at": time.time(), "step": self._step(), "exception": None}
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


def _nonempty(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


def _after_fork_in_child() -> None:
    """A forked child (DataLoader worker) must not hold the public port, nor dump its own
    SIGTERM into the rank's forensics."""
    for link in list(_links):
        link._stop.set()
        close_sockets(link.public)
        for sig in link._registered:
            try:
                faulthandler.unregister(sig)
            except (ValueError, RuntimeError):
                pass
        if link._fatal_enabled:
            faulthandler.disable()
        link.proc = None
    _links.clear()
