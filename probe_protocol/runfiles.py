"""The run dir: the files an agent, its watchdog and the CLI leave for each other on one machine.

One directory per uid (``/tmp/probe-<uid>``, or ``$PROBE_RUN_DIR``), 0700, holding per process
``<pid>.<suffix>`` files (``RunFiles``). Written by the agent (socket, info record, heartbeat,
exit record), its watchdog (its record, its log) and `probe inject` (the bootstrap and its
status); read by `probe ps`, `probe PID` and the watchdog.

The dead-process rule (``dead_files``), used by the agent at start-up and by
`probe ps --clean`: a process's files are dead when neither the process nor its watchdog runs,
where "runs" means that ``kill(pid, 0)`` finds it, it is not a zombie (a SIGKILLed rank's
orphaned watchdog is reaped late), and it did not start after the files were written (a
reused pid). A dead rank whose watchdog still runs keeps its files: the watchdog reports the
death from them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

#: The environment variable that moves the run dir.
RUN_DIR_VAR = "PROBE_RUN_DIR"
#: At most this many names are looked at by one sweep (a run dir of 1240 files was seen).
SWEEP_MAX = 5000


def default_run_dir() -> str:
    """``/tmp/probe-<uid>``: the run dir when ``PROBE_RUN_DIR`` is not set."""
    return os.path.join("/tmp", f"probe-{os.getuid()}")


def run_dir(environ: Mapping[str, str] | None = None) -> str:
    """``$PROBE_RUN_DIR``, else the default run dir."""
    env = os.environ if environ is None else environ
    return env.get(RUN_DIR_VAR) or default_run_dir()


def private_prefix() -> str:
    """Name prefix of the private ``/tmp/probe-<uid>-XXXXXX`` run dir an agent makes when its
    run dir cannot be used (the CLI looks in every directory with this prefix)."""
    return f"probe-{os.getuid()}-"


def fallback_dirs(environ: Mapping[str, str] | None = None) -> list[str]:
    """Where an agent goes, in order, when its run dir cannot be used (before a private
    ``/tmp/probe-<uid>-XXXXXX``): ``$XDG_RUNTIME_DIR/probe``."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_RUNTIME_DIR")
    return [os.path.join(xdg, "probe")] if xdg and os.path.isabs(xdg) else []


def pid_of(name: str) -> int | None:
    """The pid a run-dir file name belongs to (``4242.sock`` -> 4242), or None."""
    stem, dot, _ = name.partition(".")
    return int(stem) if dot and stem.isdigit() else None


@dataclass(frozen=True, slots=True)
class RunFiles:
    """Paths under ``run_dir`` for the process ``pid``.

    ``sock`` and ``json`` are the public discovery files (``probe PID``, ``probe ps``); the rest
    belong to the watchdog and its agent, or to `probe inject`.
    """

    run_dir: str
    pid: int

    def _p(self, suffix: str) -> str:
        return os.path.join(self.run_dir, f"{self.pid}{suffix}")

    @property
    def sock(self) -> str:
        """The public unix socket (the watchdog's, or the agent's own without a watchdog)."""
        return self._p(SOCK_SUFFIX)

    @property
    def json(self) -> str:
        """The agent's ``/v1/info`` at start-up, for `probe ps`."""
        return self._p(".json")

    @property
    def inner_name(self) -> str:
        """The agent's private socket, reached only by its watchdog. Not ``*.sock``: the CLI
        counts ``*.sock`` files to find the one local agent."""
        return f"{self.pid}.agent"

    @property
    def inner(self) -> str:
        return self._p(".agent")

    @property
    def beat(self) -> str:
        return self._p(".beat")

    @property
    def dump(self) -> str:
        """faulthandler output on request (the no-ptrace backtrace route)."""
        return self._p(".dump")

    @property
    def crash(self) -> str:
        """faulthandler output on a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL)."""
        return self._p(".crash")

    @property
    def term(self) -> str:
        """faulthandler output on SIGTERM (chained: the rank still dies of it)."""
        return self._p(".term")

    @property
    def oom(self) -> str:
        """A CUDA out-of-memory the agent's observer caught (JSON; the rank usually dies of it)."""
        return self._p(".oom.json")

    @property
    def oom_snapshot(self) -> str:
        """The CUDA allocator's history at the OOM (memory_viz's pickle format)."""
        return self._p(".oom.pickle")

    @property
    def exit_record(self) -> str:
        """What the agent saw at interpreter exit (an uncaught exception, or a plain exit)."""
        return self._p(".exit.json")

    @property
    def postmortem(self) -> str:
        """The path of this rank's post-mortem directory (probe_protocol/postmortem.py), for
        its watchdog, which records the death there."""
        return self._p(".postmortem")

    @property
    def watchdog(self) -> str:
        """The watchdog's own record: its pid, the rank's state, the port it holds."""
        return self._p(WATCHDOG_SUFFIX)

    @property
    def log(self) -> str:
        return self._p(".watchdog.log")

    @property
    def launcher(self) -> str:
        """Left by a process that started ranks with torch.multiprocessing and stopped its own
        agent, so that `probe ps` shows it as a launcher rather than as rank 0."""
        return self._p(LAUNCHER_SUFFIX)

    @property
    def inject_script(self) -> str:
        """`probe inject`'s bootstrap, run by the target."""
        return self._p(".inject.py")

    @property
    def inject_status(self) -> str:
        """The bootstrap's progress: "starting", then "started" (or "error")."""
        return self._p(".inject.json")

    def forensic_files(self) -> tuple[str, ...]:
        return (self.beat, self.dump, self.crash, self.term, self.exit_record, self.postmortem)


SOCK_SUFFIX = ".sock"
WATCHDOG_SUFFIX = ".watchdog.json"
LAUNCHER_SUFFIX = ".launcher.json"


def agent_sockets(run_dir: str) -> list[str]:
    """Names of the public agent sockets (``<pid>.sock``) in ``run_dir``, sorted."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return []
    return sorted(n for n in names if n.endswith(SOCK_SUFFIX) and pid_of(n) is not None)


# -- the dead-process rule ---------------------------------------------------------------------

def start_time(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds), or None if that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def runs(pid: int, written: float) -> bool:
    """True when ``pid`` is a live process that already ran when its files were last written
    at ``written`` (epoch seconds): not gone, not a zombie, not a newer owner of a reused pid.
    Another uid's process counts as running (it has the pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if _zombie(pid):
        return False
    started = start_time(pid)
    # One second of slack: the start time has clock-tick resolution, the mtime does not.
    return started is None or started <= written + 1.0


def watchdog_runs(run_dir: str, pid: int) -> bool:
    """True when the watchdog of ``pid`` runs. Its record is written after it starts (and again
    when its rank dies), so the record's own mtime is the time it must have run by."""
    path = RunFiles(run_dir, pid).watchdog
    try:
        with open(path) as f:
            wpid = int(json.load(f)["watchdog_pid"])
        written = os.stat(path).st_mtime
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return runs(wpid, written)


def dead_files(run_dir: str, keep: int | None = None) -> list[str]:
    """Paths in ``run_dir`` of processes whose files are dead (module docstring). ``keep``: a
    pid never to count as dead (the caller's own). Looks at most at SWEEP_MAX names."""
    try:
        names = sorted(os.listdir(run_dir))[:SWEEP_MAX]
    except OSError:
        return []
    by_pid: dict[int, list[str]] = {}
    for name in names:
        pid = pid_of(name)
        if pid is not None and pid != keep:
            by_pid.setdefault(pid, []).append(os.path.join(run_dir, name))
    dead: list[str] = []
    for pid, paths in by_pid.items():
        try:
            written = max(os.lstat(p).st_mtime for p in paths)
        except OSError:
            continue
        if not (runs(pid, written) or watchdog_runs(run_dir, pid)):
            dead += paths
    return dead
