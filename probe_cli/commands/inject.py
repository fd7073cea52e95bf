"""`probe inject PID`: start an agent inside a running Python process (see probe_cli/injection)."""

from __future__ import annotations

import json
import os
import time

import click

from probe_protocol.runfiles import RunFiles

from ..injection import injector
from ..injection.target import InjectError, check_agent_importable, check_version, inspect
from ..outcome import Outcome
from ..transport.local_socket import agent_answers
from ..transport.session import Session
from ..transport.targets import default_run_dir
from . import pass_session
from ._local import run_dir_of


@click.command("inject")
@click.argument("pid", type=click.IntRange(min=1))
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Agent port. 0 picks a free one. [default: the target's PROBE_PORT, else "
                   "9700 + its LOCAL_RANK, as with probe launch]")
@click.option("--host", default=None, help="Address the agent binds. [default: 127.0.0.1]")
@click.option("--token-file", "agent_token_file", type=click.Path(exists=True, dir_okay=False),
              default=None, help="File with the bearer token the agent will require.")
@click.option("--trace", default=None, help="Module tracing: on, off or every:N (from the next "
              "step on). [default: every:10]")
@click.option("--no-watchdog", is_flag=True,
              help="Start no watchdog (no out-of-process backtrace, no crash report).")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0.1), default=10.0,
              show_default=True, metavar="SECONDS",
              help="How long the target may take to run the bootstrap (it needs the GIL). "
                   "Past it probe gives up cleanly: the target was never stopped longer than "
                   "the injection itself, and the bootstrap will not run late.")
@pass_session
def command(session: Session, pid: int, port: int | None, host: str | None,
            agent_token_file: str | None, trace: str | None, no_watchdog: bool,
            wait_s: float) -> Outcome:
    """Start a probe agent in the running Python process PID (3.11+, started without probe).

    \b
    Then: probe PID backtrace | query | eval ..., or probe -t 127.0.0.1:PORT ...
    """
    run_dir = run_dir_of(click.get_current_context()) or default_run_dir()
    target = inspect(pid)
    route = check_version(target)
    files = RunFiles(run_dir, pid)
    sock = files.sock
    if agent_answers(sock):
        raise InjectError(f"PID {pid} already has a probe agent ({sock})",
                          help_text=f"use it: probe {pid} backtrace")
    extra = check_agent_importable(target)
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    overrides = {"PROBE_RUN_DIR": run_dir}
    for key, value in (("PROBE_PORT", port), ("PROBE_HOST", host),
                       ("PROBE_TOKEN_FILE", agent_token_file and os.path.abspath(agent_token_file)),
                       ("PROBE_TRACE", trace), ("PROBE_WATCHDOG", "0" if no_watchdog else None)):
        if value is not None:
            overrides[key] = str(value)
    status_path, script = files.inject_status, files.inject_script
    for stale in (status_path, status_path + ".tmp"):
        if os.path.exists(stale):
            os.unlink(stale)
    deadline = time.time() + wait_s
    source = injector.bootstrap_source(status_path=status_path, deadline=deadline,
                                       env=overrides, extra_paths=extra)
    with open(os.open(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(source)
    t0 = time.perf_counter()
    thread, stopped_ms = None, None
    if route == "remote_exec":
        injector.inject_remote_exec(target, script)
    else:
        thread, stopped_ms = injector.inject_ptrace(target, injector.boot_line(script))
    inject_ms = (time.perf_counter() - t0) * 1e3
    status, waited = injector.wait_status(status_path, deadline, start_timeout=60.0)
    if status is None:
        raise InjectError(
            f"PID {pid} did not run the bootstrap within {wait_s:g} s: its GIL is held (a long "
            "C call?). Nothing else changed: the target runs on, and the bootstrap will do "
            "nothing when it finally gets the GIL",
            help_text=f"see where it is: py-spy dump --pid {pid}; retry later or raise --wait")
    body = {"ok": status.get("state") in ("started", "already"), "pid": pid,
            "route": route, "python": target.version_text, "hijacked_thread": thread,
            "thread_stopped_ms": round(stopped_ms, 3) if stopped_ms is not None else None,
            "inject_ms": round(inject_ms, 3), "ready_s": round(waited, 3), **status}
    if status.get("state") == "already":
        raise InjectError(f"PID {pid} already has a probe agent ({status.get('url')})",
                          help_text=f"use it: probe {pid} backtrace")
    if status.get("state") != "started":
        raise InjectError(f"the agent did not start in PID {pid}: {status.get('error')}",
                          help_text="pip install 'probe-torch[agent]' into the target's "
                          "environment if a module is missing")
    out = Outcome()
    if session.output == "json":
        out.stdout.append(json.dumps(body))
        return out
    via = f"thread {thread} stopped {stopped_ms:.1f} ms" if thread else "sys.remote_exec"
    out.stdout.append(f"agent started in PID {pid} (Python {target.version_text}; {via}; "
                      f"ready after {waited:.1f} s)")
    out.stdout.append(f"    {status.get('url') or '(no TCP)'}  unix:{status.get('unix_socket')}")
    out.stdout.append(f"    try: probe {pid} backtrace")
    return out
