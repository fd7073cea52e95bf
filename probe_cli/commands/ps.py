"""`probe ps`: local Python processes with an agent, dead ranks still reported by their
watchdog, and the Python processes `probe inject` could attach to."""

from __future__ import annotations

import json
import os
import re

import click

from probe_protocol.bodies import InfoBody
from probe_protocol.runfiles import (
    LAUNCHER_SUFFIX,
    SOCK_SUFFIX,
    WATCHDOG_SUFFIX,
    RunFiles,
    dead_files,
    pid_of,
)

from ..outcome import Outcome
from ..render.text import format_table
from ..transport.local_socket import ask_socket
from ..transport.session import Session
from ..transport.targets import default_run_dir, local_run_dirs
from ..transport.untrusted_text import escape_body
from . import pass_session
from ._local import run_dir_of

#: Rows `probe ps` shows only with --all: Python processes without an agent.
_NOT_AGENTS = ("injectable", "no", "probe helper")
_PY = re.compile(r"(?:^|/)(?:lib)?python(3\.\d+)(t?)(?:\.so|$)")
COLUMNS = ("PID", "AGENT", "RANK", "PYTHON", "ADDRESS", "COMMAND")


def python_version(pid: int) -> str | None:
    """``3.11`` from the executable or libpython mapping; None when not a Python process."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    m = _PY.search(exe)
    if m:
        return m.group(1) + m.group(2)
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if "libpython3" in line:
                    m = _PY.search(line.split()[-1])
                    if m:
                        return m.group(1) + m.group(2)
    except OSError:
        return None
    return None


#: What a Python process that is not a rank is, by its command: launchers start ranks (attach
#: to the ranks, never to them), the agent's helpers (the C++ hot path's builder, the watchdog)
#: and the CLI itself are probe's own. The agent decides the same for PROBE=1
#: (probe_agent/_autostart.py); the CLI cannot import it, so the list is repeated here.
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch",
                     "deepspeed.launcher.runner", "deepspeed.launcher.launch",
                     "accelerate.commands.launch", "torch._inductor.compile_worker")
_LAUNCHER_SCRIPTS = ("torchrun", "deepspeed", "accelerate-launch")


def _role(argv: list[str]) -> str | None:
    """``launcher``, ``probe helper`` or None (a program that may be injected)."""
    mods = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"]
    if any(m.startswith(("probe_agent", "probe_cli")) for m in mods):
        return "probe helper"
    if any(m.startswith(_LAUNCHER_MODULES) for m in mods):
        return "launcher"
    scripts = [os.path.basename(a) for a in argv[1:3] if not a.startswith("-")]
    if any(s in _LAUNCHER_SCRIPTS or s == "probe" for s in scripts[:1]):
        return "launcher" if scripts[0] != "probe" else "probe helper"
    if scripts[:2] == ["accelerate", "launch"]:
        return "launcher"
    return None


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return " ".join(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except OSError:
        return "?"


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            value = json.load(f)
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def _injectable(version: str | None) -> bool:
    if not version or version.endswith("t"):
        return False
    major, minor = (int(x) for x in version.split("."))
    return (major, minor) >= (3, 11)


def list_processes(run_dir: str) -> list[dict]:
    """One dict per process: pid, agent (answering | dead: ... | launcher | stale socket |
    injectable | no), rank, python, address, command. Agents in fallback run dirs are listed too."""
    rows: dict[int, dict] = {}
    for d in local_run_dirs(run_dir):
        _agents_in(d, rows)
    _other_pythons(rows)
    order = {"answering": 0, "stale socket": 2, "injectable": 3, "probe helper": 4, "no": 5}
    return sorted(rows.values(), key=lambda r: (order.get(r["agent"], 1), r["pid"]))


def _agents_in(run_dir: str, rows: dict[int, dict]) -> None:
    names = os.listdir(run_dir) if os.path.isdir(run_dir) else []
    for name in names:
        if name.endswith(WATCHDOG_SUFFIX):
            rec = _read_json(os.path.join(run_dir, name))
            if rec.get("state") == "dead" and isinstance(rec.get("pid"), int):
                e = rec.get("exit") or {}
                sock = RunFiles(run_dir, rec["pid"]).sock
                rows[rec["pid"]] = {"pid": rec["pid"], "agent": f"dead: {e.get('description')}",
                                    "rank": rec.get("rank"), "python": None,
                                    "address": f"unix:{sock}",
                                    "command": "(exited; its watchdog reports it)"}
    for name in names:
        # a process that started ranks with torch.multiprocessing stopped its agent
        # and left this record, so that it shows as what it is rather than as rank 0.
        pid = pid_of(name)
        if name.endswith(LAUNCHER_SUFFIX) and pid is not None and os.path.exists(f"/proc/{pid}"):
            rows[pid] = {"pid": pid, "agent": "launcher", "rank": None,
                         "python": python_version(pid), "address": None,
                         "command": _cmdline(pid)}
    for name in names:
        pid = pid_of(name)
        if pid is None or pid in rows or name != f"{pid}{SOCK_SUFFIX}":
            continue
        info = InfoBody.from_wire(_read_json(RunFiles(run_dir, pid).json))
        body = ask_socket(os.path.join(run_dir, name))
        alive = isinstance(body, dict) and body.get("ok") is True
        rows[pid] = {"pid": pid, "agent": "answering" if alive else "stale socket",
                     "rank": info.rank, "python": info.python,
                     "address": info.url or f"unix:{os.path.join(run_dir, name)}",
                     "command": _cmdline(pid)}


def _other_pythons(rows: dict[int, dict]) -> None:
    me, uid = os.getpid(), os.geteuid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in rows or int(entry) == me:
            continue
        pid = int(entry)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid and uid != 0:
                continue
        except OSError:
            continue
        version = python_version(pid)
        if version is None or "probe_agent.watchdog" in _cmdline(pid):
            continue  # not Python, or a watchdog (it is listed under its rank)
        role = _role(_argv(pid))
        rows[pid] = {"pid": pid, "agent": role or ("injectable" if _injectable(version) else "no"),
                     "rank": None, "python": version, "address": None, "command": _cmdline(pid)}


@click.command("ps")
@click.option("--clean", is_flag=True,
              help="First remove the run-dir files of processes that are gone (their sockets, "
                   "records and forensics). Agents also do this when they start.")
@click.option("--all", "show_all", is_flag=True,
              help="Also list your other Python processes (those `probe inject PID` can attach "
                   "to, and probe's own helpers) and stale sockets of processes that are gone. "
                   "Default: agents and launchers only; the rest counted on stderr.")
@pass_session
def command(session: Session, clean: bool, show_all: bool) -> Outcome:
    """Local processes with an agent (answering, or dead and reported by its watchdog) and the
    launchers that started them; with --all, also the Python processes `probe inject PID` can
    attach to (yours, Python 3.11+)."""
    run_dir = run_dir_of(click.get_current_context()) or default_run_dir()
    out = Outcome()
    if clean:
        removed = 0
        for d in local_run_dirs(run_dir):
            for path in dead_files(d):
                try:
                    os.unlink(path)
                    removed += 1
                except OSError:
                    pass
        out.stderr.append(f"probe: removed {removed} files of processes that are gone")
    # Command lines and run-dir files are the processes' own text: escaped like agents' answers.
    rows = list_processes(run_dir) if session.raw else escape_body(list_processes(run_dir))
    stale = [r for r in rows if r["agent"] == "stale socket"]
    if stale and not show_all:
        rows = [r for r in rows if r["agent"] != "stale socket"]
        out.stderr.append(f"probe: {len(stale)} stale agent sockets of processes that are gone "
                          "not shown (--all lists them; `probe ps --clean` removes them)")
    others = [r for r in rows if r["agent"] in _NOT_AGENTS]
    if others and not show_all:
        # a machine runs many Python processes: the agents are what people look for here
        rows = [r for r in rows if r["agent"] not in _NOT_AGENTS]
        out.stderr.append(f"probe: {len(others)} other Python process"
                          f"{'es' if len(others) != 1 else ''} of yours not shown (`probe ps "
                          "--all` lists them, with those `probe inject PID` can attach to)")
    if session.output == "json":
        out.stdout.append(json.dumps(rows))
        return out
    table = [[r["pid"], r["agent"], "-" if r["rank"] is None else r["rank"], r["python"] or "-",
              r["address"] or "",
              r["command"][:60]] for r in rows]
    out.stdout.extend(format_table(COLUMNS, table, colour=session.colour))
    if not rows:
        out.stderr.append(f"probe: no agent found in {run_dir}: start the job with PROBE=1 in "
                          "its environment (or `probe launch -- CMD`), or attach to a running "
                          "one with `probe inject PID`")
    return out
