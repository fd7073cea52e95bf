"""Inject: write the bootstrap, run it in the target, wait for the agent to say it started.

See the package docstring for the route and why it is safe. Timeline of a ptrace injection:

    seize one thread ─ interrupt ─ safe moment? ─ save regs + xstate ─ mmap ─ write routine
    ─ PyThread_start_new_thread ─ restore regs + xstate ─ detach          (2–15 ms, measured)
    ... the new thread gets the GIL, runs <run_dir>/<pid>.inject.py, which starts the agent
    and writes <run_dir>/<pid>.inject.json: "starting", then "started" (or "error").
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

from . import ptrace
from .target import InjectError, Target, permission_help, target_interpreter

#: Syscalls in which a thread holds no malloc or loader lock: waiting for something.
SAFE_SYSCALLS = frozenset({7, 23, 34, 35, 43, 45, 47, 61, 128, 202, 230, 232, 247, 270, 271,
                           281, 288, 441, 449})
PROT_READ, PROT_EXEC = 1, 4
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20
PAGE = 8192
#: void routine(void **a) { s = a[0](); a[1](a[3], NULL); a[2](s); }  ==
#:   PyGILState_Ensure / PyRun_SimpleString(Flags) / PyGILState_Release, stack kept aligned.
ROUTINE = bytes.fromhex(
    "53" "4889fb" "ff13" "50" "4883ec08" "488b7b18" "31f6" "ff5308" "4883c408" "5f" "ff5310"
    "5b" "31c0" "c3")
ARGS_AT, CODE_AT = 64, 128
SAFE_MOMENT_S = 3.0


def _unsafe_ranges(t: Target) -> list[tuple[int, int]]:
    """Code of libc and the dynamic loader: a thread stopped there may hold their locks."""
    out = []
    for m in t.maps:
        base = os.path.basename(m.path)
        if "x" in m.perms and (base.startswith(("libc.so", "libc-", "ld-linux", "ld-musl",
                                               "libpthread", "libdl"))):
            out.append((m.start, m.end))
    return out


def _threads(pid: int) -> list[int]:
    tids = sorted(int(x) for x in os.listdir(f"/proc/{pid}/task"))
    return sorted(tids, key=lambda tid: tid != pid)  # the main thread first


def _safe(regs: ptrace.Regs, unsafe: list[tuple[int, int]]) -> bool:
    nr = regs.orig_rax if regs.orig_rax < 2**63 else -1
    if nr >= 0:
        return nr in SAFE_SYSCALLS
    return not any(lo <= regs.rip < hi for lo, hi in unsafe)


def _stop_at_safe_moment(t: Target) -> ptrace.Tracee:
    """A seized, stopped thread at a safe moment (see SAFE_SYSCALLS), or InjectError.

    The main thread gets most of the time budget; then every other thread a short turn."""
    unsafe = _unsafe_ranges(t)
    end = time.monotonic() + SAFE_MOMENT_S
    for tid in _threads(t.pid):
        budget = SAFE_MOMENT_S / 2 if tid == t.pid else 0.1
        turn_end = min(end, time.monotonic() + budget)
        tracee = ptrace.Tracee(t.pid, tid)
        try:
            tracee.seize()
        except ptrace.PtraceError as e:
            if e.errno in (1, 13):  # EPERM, EACCES
                raise InjectError(f"not permitted to ptrace PID {t.pid} ({e.strerror})",
                                  help_text=permission_help()) from None
            continue  # the thread exited meanwhile
        try:
            while True:
                tracee.interrupt()
                if _safe(tracee.regs(), unsafe):
                    return tracee
                if time.monotonic() > turn_end:
                    break
                tracee.cont()
                time.sleep(0.002)
        except (ptrace.PtraceError, ptrace.TargetGone, TimeoutError):
            pass
        tracee.detach()
        if time.monotonic() > end:
            break
    raise InjectError(f"PID {t.pid}: no thread reached a safe point (outside libc, or waiting) "
                      f"within {SAFE_MOMENT_S:g} s; nothing was changed", help_text="retry")


def inject_ptrace(t: Target, boot_code: str) -> tuple[int, float]:
    """Start a native thread in ``t`` that runs ``boot_code`` under the GIL. Returns (the
    hijacked thread id, milliseconds the thread was stopped)."""
    assert t.python is not None and t.libc is not None
    addr = {n: t.python.address(n) for n in ("PyGILState_Ensure", "PyGILState_Release",
                                             "PyThread_start_new_thread")}
    addr["run"] = t.python.address("PyRun_SimpleString") or \
        t.python.address("PyRun_SimpleStringFlags")
    missing = [n for n, a in addr.items() if a is None]
    if missing:
        raise InjectError(f"PID {t.pid}: the Python C API lacks {', '.join(missing)}")
    fn: dict[str, int] = {n: a for n, a in addr.items() if a is not None}
    mmap = t.libc.address("mmap")
    assert mmap is not None
    code = boot_code.encode() + b"\0"
    if CODE_AT + len(code) > PAGE:
        raise InjectError("bootstrap code too long")
    tracee = _stop_at_safe_moment(t)
    t0 = time.perf_counter()
    try:
        saved, xsave = tracee.regs(), tracee.xstate()
        try:
            page = tracee.call(saved, mmap, 0, PAGE, PROT_READ | PROT_EXEC,
                               MAP_PRIVATE | MAP_ANONYMOUS, 2**64 - 1, 0)
            if page >= 2**64 - 4096:
                raise InjectError(f"mmap in PID {t.pid} failed (errno {2**64 - page})")
            args = b"".join(int(a).to_bytes(8, "little") for a in (
                fn["PyGILState_Ensure"], fn["run"], fn["PyGILState_Release"],
                page + CODE_AT))
            tracee.poke(page, ROUTINE)
            tracee.poke(page + ARGS_AT, args)
            tracee.poke(page + CODE_AT, code)
            tid = tracee.call(saved, fn["PyThread_start_new_thread"], page, page + ARGS_AT)
            if tid in (0, 2**64 - 1):
                raise InjectError(f"PyThread_start_new_thread failed in PID {t.pid}")
        finally:
            tracee.set_xstate(xsave)
            tracee.set_regs(saved)
        stopped_ms = (time.perf_counter() - t0) * 1e3
        return tracee.tid, stopped_ms
    except ptrace.TargetGone:
        raise InjectError(f"PID {t.pid} exited during the injection") from None
    finally:
        tracee.detach()


def inject_remote_exec(t: Target, script: str) -> None:
    """3.14+: the target's own interpreter asks the target to run ``script`` (PEP 768)."""
    exe = target_interpreter(t)
    r = subprocess.run([exe, "-c", f"import sys; sys.remote_exec({t.pid}, {script!r})"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise InjectError(f"sys.remote_exec into PID {t.pid} failed: "
                          f"{(r.stderr.strip().splitlines() or ['?'])[-1]}",
                          help_text=permission_help())


def read_status(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def wait_status(path: str, deadline: float, start_timeout: float) -> tuple[dict[str, Any] | None,
                                                                              float]:
    """Wait for the bootstrap's status: any by ``deadline`` (it runs once it has the GIL), then
    ``started``/``error`` within ``start_timeout`` more (the agent imports duckdb & co)."""
    t0 = time.monotonic()
    status = None
    while time.time() < deadline + 0.5:
        status = read_status(path)
        if status is not None:
            break
        time.sleep(0.01)
    if status is None:
        return None, time.monotonic() - t0
    end = time.monotonic() + start_timeout
    while status.get("state") == "starting" and time.monotonic() < end:
        time.sleep(0.02)
        status = read_status(path) or status
    return status, time.monotonic() - t0


def bootstrap_source(*, status_path: str, deadline: float, env: dict[str, str],
                     extra_paths: list[str]) -> str:
    """The file the target executes (with its own globals, never ``__main__``'s)."""
    return f'''# probe inject bootstrap: written by `probe inject`, run once inside the target.
import json, os, sys, threading, time

STATUS = {status_path!r}


def _status(**kw):
    tmp = STATUS + ".tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(kw, f)
    os.replace(tmp, STATUS)


def _start():
    try:
        for p in {extra_paths!r}:
            if p not in sys.path:
                sys.path.append(p)  # after the target's own: its packages win
        from probe_agent.attach import attach
        _status(**attach({env!r}))
    except BaseException as e:
        _status(state="error", error=f"{{type(e).__name__}}: {{e}}", python=sys.version.split()[0])


if time.time() < {deadline!r}:  # past it, `probe inject` has already reported a timeout
    _status(state="starting", pid=os.getpid())
    threading.Thread(target=_start, name="probe-agent.attach", daemon=True).start()
'''


def boot_line(script: str) -> str:
    """What PyRun_SimpleString runs: one expression, so ``__main__`` gets no new names."""
    return (f"exec(compile(open({script!r}).read(), {script!r}, 'exec'), "
            "{'__name__': '__probe_inject__'})")

