"""What we know about an injection target before touching it, and every pre-flight check.

Each failed check raises ``InjectError`` with one line saying what is wrong and a hint saying
what to do (the py-spy / pystack wording for ptrace permission problems).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, field

from ..errors import ProbeCLIError
from . import elf

CAP_SYS_PTRACE = 19
AGENT_MODULES = ("probe_agent", "duckdb", "fastapi", "uvicorn", "pyarrow")
_LIBPY = re.compile(r"libpython(3\.\d+)(t?)\.so")
_EXE = re.compile(r"python(3\.\d+)(t?)$")


class InjectError(ProbeCLIError):
    """An injection that cannot (or did not) happen; nothing in the target was changed unless
    the message says so."""


@dataclass(slots=True)
class Target:
    pid: int
    uid: int
    name: str
    argv: list[str]
    version: tuple[int, int] | None
    free_threaded: bool
    python: elf.LoadedObject | None = None
    libc: elf.LoadedObject | None = None
    maps: list[elf.Mapping] = field(default_factory=list)
    environ: dict[str, str] = field(default_factory=dict)

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version)) if self.version else "unknown"


def _status_field(pid: int, key: str) -> str | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def has_cap_sys_ptrace() -> bool:
    eff = _status_field(os.getpid(), "CapEff")
    return eff is not None and bool(int(eff, 16) >> CAP_SYS_PTRACE & 1)


def in_container() -> bool:
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return True
    try:
        with open("/proc/1/cgroup") as f:
            text = f.read()
    except OSError:
        return False
    return any(k in text for k in ("docker", "kubepods", "containerd", "lxc"))


def ptrace_scope() -> int | None:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def permission_help() -> str:
    """Why ptrace may be refused here, and what to do (py-spy's distinctions)."""
    scope = ptrace_scope()
    if scope == 3:
        return "ptrace is disabled on this machine (kernel.yama.ptrace_scope=3) until reboot"
    if os.geteuid() == 0 and not has_cap_sys_ptrace():
        hint = "running as root without CAP_SYS_PTRACE"
        if in_container():
            hint += " in a container: start it with --cap-add=SYS_PTRACE"
        return hint
    if scope in (1, 2) and os.geteuid() != 0:
        return (f"kernel.yama.ptrace_scope={scope} lets only root attach to a process that is "
                "not its child: run `sudo probe inject PID`, or (scope 1) `echo 0 | sudo tee "
                "/proc/sys/kernel/yama/ptrace_scope`")
    return "run probe as the target's user or as root"


def _major_minor(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def _python_object(pid: int, maps: list[elf.Mapping]) -> tuple[elf.LoadedObject | None,
                                                                  tuple[int, int] | None, bool]:
    lib = next((m for m in maps if _LIBPY.search(os.path.basename(m.path))), None)
    exe = os.readlink(f"/proc/{pid}/exe")
    version: tuple[int, int] | None = None
    threaded = False
    if lib is not None:
        m = _LIBPY.search(os.path.basename(lib.path))
        assert m
        version = _major_minor(m.group(1))
        threaded = m.group(2) == "t"
        obj = elf.loaded_object(pid, maps, os.path.basename(lib.path))
    else:
        obj = elf.executable(pid, maps)
        m = _EXE.search(os.path.basename(exe))
        if m:
            version = _major_minor(m.group(1))
            threaded = m.group(2) == "t"
    if obj is not None and "PyThread_start_new_thread" not in obj.elf.symbols:
        obj = None
    if obj is not None:
        raw = obj.elf.read_const("Py_Version", 4)  # 3.11+: PY_VERSION_HEX
        if raw:
            hexv = int.from_bytes(raw, "little")
            version = (hexv >> 24, (hexv >> 16) & 0xFF)
    return obj, version, threaded


def inspect(pid: int) -> Target:
    """Everything about ``pid`` that needs no ptrace; raises InjectError when it is hopeless."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise InjectError(f"probe inject supports Linux x86-64 only (this is "
                          f"{platform.system()} {platform.machine()})")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise InjectError(f"no process with PID {pid}", help_text="`probe ps` lists Python "
                          "processes you can inject into") from None
    except PermissionError:
        pass
    uid_line = _status_field(pid, "Uid") or ""
    uid = int(uid_line.split()[1]) if uid_line else -1
    if uid != os.geteuid() and os.geteuid() != 0:
        raise InjectError(f"PID {pid} runs as uid {uid}, not as you (uid {os.geteuid()})",
                          help_text="run probe inject as that user, or as root")
    name = _status_field(pid, "Name") or "?"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        maps = elf.read_maps(pid)
    except OSError as e:
        raise InjectError(f"cannot read /proc/{pid} ({e.strerror})",
                          help_text=permission_help()) from None
    obj, version, threaded = _python_object(pid, maps)
    if obj is None:
        raise InjectError(f"PID {pid} ({name}) is not a Python process (no libpython and no "
                          "exported Python C API in its executable)")
    t = Target(pid, uid, name, argv, version, threaded, obj, None, maps)
    t.libc = elf.loaded_object(pid, maps, "libc.so") or elf.loaded_object(pid, maps, "libc-")
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = [e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e]
        t.environ = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
    except OSError:
        pass
    return t


def check_version(t: Target) -> str:
    """``"remote_exec"`` (3.14+) or ``"ptrace"`` (3.11–3.13); raises for anything else."""
    if t.version is None:
        raise InjectError(f"cannot tell the Python version of PID {t.pid}")
    if t.free_threaded:
        raise InjectError(f"PID {t.pid} runs a free-threaded Python {t.version_text}t; probe "
                          "inject supports GIL builds only")
    if t.version >= (3, 14):
        return "remote_exec"
    if t.version < (3, 11):
        raise InjectError(f"PID {t.pid} runs Python {t.version_text}; probe inject needs 3.11 or "
                          "newer", help_text="start that job with `probe launch` or PROBE=1 "
                          "instead")
    if t.libc is None or t.libc.address("mmap") is None:
        raise InjectError(f"PID {t.pid}: no glibc mmap found in the target (musl?)")
    return "ptrace"


def target_interpreter(t: Target) -> str:
    """The interpreter path as the target was started (a venv's ``bin/python``, which a
    fresh process needs to see the same site-packages), falling back to /proc/PID/exe."""
    argv0 = t.argv[0] if t.argv else ""
    cwd = os.readlink(f"/proc/{t.pid}/cwd")
    if "/" in argv0:
        path = argv0 if os.path.isabs(argv0) else os.path.join(cwd, argv0)
        if os.access(path, os.X_OK):
            return path
    elif argv0:
        for d in t.environ.get("PATH", "").split(":"):
            path = os.path.join(d, argv0)
            if d and os.access(path, os.X_OK):
                return path
    return os.readlink(f"/proc/{t.pid}/exe")


def check_agent_importable(t: Target, timeout: float = 20.0) -> list[str]:
    """Extra ``sys.path`` entries the bootstrap needs (empty when the target's environment has
    the agent); raises InjectError when neither the target nor this CLI can supply it."""
    env = {k: v for k, v in t.environ.items() if not k.startswith("PROBE")}
    code = ("import importlib.util as u, json, sys; print(json.dumps({m: u.find_spec(m) is not "
            f"None for m in {list(AGENT_MODULES)!r}}})")
    exe = target_interpreter(t)
    try:
        out = subprocess.run([exe, "-c", code], env=env, cwd=os.readlink(f"/proc/{t.pid}/cwd"),
                             capture_output=True, timeout=timeout, check=True).stdout
        found = json.loads(out.decode().strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return []  # cannot tell; the bootstrap reports a missing module itself
    missing = [m for m, ok in found.items() if not ok]
    if not missing:
        return []
    paths = _our_paths(missing) if sys.version_info[:2] == t.version else None
    if paths is None:
        raise InjectError(
            f"the target (Python {t.version_text}, {exe}) cannot import {', '.join(missing)}",
            help_text=f"install the agent into that environment: {exe} -m pip install "
                      "'probe-torch[agent]'")
    return paths


def _our_paths(modules: list[str]) -> list[str] | None:
    """Directories from which this CLI's interpreter imports ``modules`` (same X.Y only).
    Appended after the target's own sys.path, so its packages win any overlap."""
    import importlib.util

    paths: list[str] = []
    for name in modules:
        spec = importlib.util.find_spec(name)  # locates; nothing is imported
        if spec is None or not spec.origin:
            return None
        top = os.path.dirname(spec.origin)
        if spec.submodule_search_locations:
            top = os.path.dirname(top)
        if top not in paths:
            paths.append(top)
    return paths
