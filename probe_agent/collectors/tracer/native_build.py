"""Building the tracer's C++ hot path: the builder child process, and building ahead of time.

Run as ``python -m probe_agent.collectors.tracer.native_build NAME DIR PARENT_PID`` by a rank
(``build``); ``native_ahead.py`` builds ahead of time (``probe build-native``).

Why it is shaped this way: a rank killed mid-build must not leave anything that outlives it or
that blocks the next job.
- The builder dies with the rank that started it: ``PR_SET_PDEATHSIG`` on Linux, and elsewhere
  (or if the rank died before the ``prctl``) a thread that sees the parent pid change. It leads
  its own process group, so dying takes the compiler and ninja with it.
- Builders serialize on an ``flock`` of our own (``build.flock``), which the kernel releases when
  its holder dies; torch's own lock (``FileBaton``'s ``lock``) is a plain file a killed build
  leaves behind, so whoever holds our lock removes it: no live builder can hold it then.
- The compiler's output goes to ``build.log`` beside the build, which the status names.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from probe_protocol import owned_tree

#: One translation unit, in this order (the first has the includes and the record constants).
SOURCES = [Path(__file__).with_name(f) for f in ("trace_native_backward.cpp", "trace_native.cpp")]
BUILD_TIMEOUT_S = 900
LOG = "build.log"
FLOCK = "build.flock"
_PR_SET_PDEATHSIG = 1


class BuildFailed(RuntimeError):
    """The compiler ran and failed; ``str`` is ``build failed: see <log>`` or its last words."""


def build(name: str, directory: Path) -> None:
    """Compile in a child process at the lowest priority; raise ``BuildFailed`` (or
    RuntimeError when there is no compiler)."""
    if compiler() is None:
        raise RuntimeError("no compiler: none of c++, g++, clang++ on PATH (or set CXX)")
    private_dir(directory)
    cmd = [sys.executable, "-m", __name__, name, str(directory), str(os.getpid())]
    if shutil.which("nice"):
        cmd = ["nice", "-n", "19", *cmd]  # nice execs: the builder's parent stays this process
    env = dict(os.environ, PROBE="0", MAX_JOBS="1")  # no agent in the builder; one core
    # ninja from the `ninja` wheel sits beside this interpreter, on PATH or not
    env["PATH"] = os.pathsep.join(p for p in (os.path.dirname(sys.executable),
                                              env.get("PATH")) if p)
    # the child imports this module from where this process found it
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[3]), env.get("PYTHONPATH")) if p)
    env.pop("PYTHONSTARTUP", None)
    # what it says before it holds the lock (and so before build.log is its): a file, not a
    # pipe, so a chatty compiler can never block on a full pipe
    with tempfile.TemporaryFile("w+") as early:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=early,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            raise BuildFailed(f"build failed: over {BUILD_TIMEOUT_S} s, killed") from None
        if rc == 0 and (directory / f"{name}.so").exists():
            return
        log_file = directory / LOG
        if rc == 3 and log_file.exists():  # the builder held the lock and its build failed
            raise BuildFailed(f"build failed: see {log_file}")
        early.seek(0)
        words = early.read().strip().splitlines()[-2:] or [f"builder exited {rc}"]
        raise BuildFailed("build failed: " + " | ".join(w.strip() for w in words))


def private_dir(directory: Path) -> None:
    """Build only in a directory of ours that nobody else can write, reached through no one
    else's link or directory (made 0700 where missing). On shared scratch another uid could
    otherwise plant ``build.log`` as a link to one of the owner's files (the builder truncates
    it) or swap ``build.ninja`` during the build (ninja runs it as the owner). Raises
    PermissionError, one line naming PROBE_NATIVE_DIR."""
    os.close(owned_tree.open_root(str(directory), create=True, setting="PROBE_NATIVE_DIR",
                                  doing="building the C++ hot path", private=True))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _descendants() -> list[int]:
    """This process's live descendants (Linux /proc; elsewhere none are found)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [os.getpid()]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _die_with(parent: int) -> None:
    """Take this builder, and the compiler under it, down when ``parent`` is gone."""
    def die(*_: object) -> None:
        # ninja starts each compiler in a process group of its own: the group is not enough
        try:
            for pid in _descendants():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        finally:
            os.killpg(0, signal.SIGKILL)

    signal.signal(signal.SIGTERM, die)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:  # it died before the prctl: no signal will come
        die()

    def watch() -> None:  # the portable path; on Linux a second line behind the signal
        while not stopped.wait(0.5):
            if os.getppid() != parent:
                die()

    stopped = threading.Event()
    threading.Thread(target=watch, daemon=True, name="probe-native-watch").start()


def _build_here(name: str, directory: Path) -> int:
    """Under our lock: build unless another builder just did; 0 built, 3 failed (see the log)."""
    fd = os.open(directory / FLOCK, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited: O_CLOEXEC
    fcntl.flock(fd, fcntl.LOCK_EX)  # waits for a live builder; a dead one's is released
    if (directory / f"{name}.so").exists():
        return 0
    # Holding our lock, no live probe builder is in this directory: torch's lock is stale.
    (directory / "lock").unlink(missing_ok=True)
    log_fd = os.open(directory / LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                     0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    from torch.utils.cpp_extension import load_inline

    try:
        load_inline(name, cpp_sources=[src.read_text() for src in SOURCES],
                    extra_cflags=["-O2"], build_directory=str(directory), verbose=False)
    except Exception as e:  # noqa: BLE001 - the compiler's words go to the log, the code says so
        print(f"probe: the C++ hot path did not build:\n{e}", file=sys.stderr, flush=True)
        return 3
    return 0


def compiler() -> str | None:
    """The C++ compiler ``load_inline`` would run ($CXX, else c++, g++ or clang++ on PATH)."""
    return os.environ.get("CXX") or next(
        (c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)


if __name__ == "__main__":
    _die_with(int(sys.argv[3]))
    sys.exit(_build_here(sys.argv[1], Path(sys.argv[2])))
