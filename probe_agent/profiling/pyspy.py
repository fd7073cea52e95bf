"""``py-spy record --nonblocking`` on this rank, from a child process (`probe flame`).

Why it is the default sampler where it can run: it reads the rank's memory from outside without
taking the GIL, so the training thread pays nothing measurable (bench/bench_profile.py, 100 Hz,
30 ms steps: x1.00 against x1.01-x1.05 for the in-process sampler, which must take the GIL for
every sample). It costs more CPU in its own process (about 15% of a core against 3%), and it
needs ptrace rights over the rank: a container without SYS_PTRACE, or Yama's ptrace_scope=1
naming another tracer (the watchdog), refuses it. Then ``record`` returns the reason and the
session falls back to the in-process sampler (collectors/sampler.py).

Options: ``--idle`` (a thread waiting in ``all_reduce`` or a DataLoader counts where it waits,
as in-process), ``--threads`` (each stack starts with ``thread (native id): name``, so the
agent's own threads can be left out by name), ``--function`` (frames by function, as in-process),
``--full-filenames`` (so the agent's own frames can be recognised by path, then shortened).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

from ..collectors.sampler import AGENT_DIR, AGENT_THREADS

_THREAD = re.compile(r"^thread \((\d+)\): ?(.*)$")
_FRAME = re.compile(r"^(.*) \((.*):(\d+)\)$")
#: Extra seconds py-spy may take beyond the sampling (attach, write).
GRACE_S = 15.0


def find_pyspy() -> str | None:
    """PROBE_PYSPY, then py-spy next to this interpreter (a venv), then PATH."""
    for cand in (os.environ.get("PROBE_PYSPY"),
                 os.path.join(os.path.dirname(sys.executable), "py-spy"),
                 os.path.join(sysconfig.get_path("scripts"), "py-spy"),
                 shutil.which("py-spy")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def record(pyspy: str, pid: int, seconds: float, rate: float, out_dir: str
           ) -> tuple[dict[str, int] | None, float, str | None]:
    """Sample ``pid`` for ``seconds``; returns (folded stacks or None, py-spy's CPU s, error)."""
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    fd, out = tempfile.mkstemp(prefix="flame-", suffix=".txt", dir=out_dir)
    os.close(fd)
    cmd = [pyspy, "record", "--nonblocking", "--idle", "--threads", "--function",
           "--full-filenames", "-r", str(max(1, round(rate))), "-d", str(max(1, round(seconds))),
           "-p", str(pid), "-f", "raw", "-o", out]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL)
    except OSError as e:
        os.unlink(out)
        return None, 0.0, f"py-spy could not start: {e}"
    deadline = time.monotonic() + seconds + GRACE_S
    status, usage = 0, None
    while True:  # wait4, not wait(): the child's own CPU time is the cost we report
        wpid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if wpid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.05)
    err = (proc.stderr.read().decode(errors="replace") if proc.stderr else "").strip()
    if proc.stderr:
        proc.stderr.close()
    cpu = (usage.ru_utime + usage.ru_stime) if usage is not None else 0.0
    try:
        with open(out, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    finally:
        try:
            os.unlink(out)
        except OSError:
            pass
    if proc.returncode != 0 or not text.strip():
        why = err.splitlines()[-1] if err else f"exit status {proc.returncode}"
        return None, cpu, f"py-spy failed: {why}"
    return parse_raw(text), cpu, None


def parse_raw(text: str, hide_dir: str = AGENT_DIR) -> dict[str, int]:
    """py-spy's raw lines -> the in-process sampler's folded format: ``thread name;frame;...``
    with frames as ``qualname (dir/file.py:line)``, the agent's threads and frames left out."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        first, *frames = stack.split(";")
        m = _THREAD.match(first)
        thread = (m.group(2) or f"thread {m.group(1)}") if m else first
        if thread.startswith(AGENT_THREADS):
            continue
        labels = [thread]
        for frame in frames:
            f = _FRAME.match(frame)
            if f is None:
                labels.append(frame)
                continue
            name, path, lineno = f.groups()
            if path.startswith(hide_dir):
                continue
            short = "/".join(path.split("/")[-2:])
            labels.append(f"{name} ({short}:{lineno})")
        key = ";".join(labels)
        out[key] = out.get(key, 0) + int(count)
    return out
