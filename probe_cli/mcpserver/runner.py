"""Runs one `probe` command for the MCP server, as a child process, and bounds its answer.

Why a child process: the server's stdout is the MCP channel, and a command prints (a streamed
`query --json` prints while it asks); a child's stdout is a pipe of its own. It is the CLI, so
every rule of the CLI holds: the owner check on every connection, the token (passed in the
environment, never on a command line `ps` shows), TLS, exit codes. ``PROBE_VIA=mcp`` makes the
agents audit each request as sent via the MCP server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: What a tool's answer may hold, so a large table cannot flood the agent's context.
DEFAULT_MAX_BYTES = 64 << 10
#: Longest a command may run (its own --timeout bounds each rank; this bounds the whole).
COMMAND_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class GroupOptions:
    """The `probe` group options the server was started with, repeated on every command."""

    targets: tuple[str, ...] = ()
    hostfile: str | None = None
    ranks: str | None = None
    timeout: float = 5.0
    cacert: str | None = None
    run_dir: str | None = None
    token: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def argv(self) -> list[str]:
        out: list[str] = []
        for t in self.targets:
            out += ["-t", t]
        if self.hostfile:
            out += ["--hostfile", self.hostfile]
        if self.ranks:
            out += ["--rank", self.ranks]
        if self.cacert:
            out += ["--cacert", self.cacert]
        if self.run_dir:
            out += ["--run-dir", self.run_dir]
        return [*out, "--timeout", f"{self.timeout:g}", "--no-color"]

    def environ(self) -> dict[str, str]:
        env = {**os.environ, **self.env, "PROBE_VIA": "mcp", "NO_COLOR": "1"}
        env.pop("FORCE_COLOR", None)
        if self.token:
            env["PROBE_TOKEN"] = self.token
        return env


@dataclass(frozen=True, slots=True)
class CommandRun:
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool


def run_command(opts: GroupOptions, args: Sequence[str], *, json_output: bool,
                max_bytes: int = DEFAULT_MAX_BYTES) -> CommandRun:
    """``probe [group options] [--json] ARGS``; never raises for what the command did."""
    argv = [sys.executable, "-m", "probe_cli", *opts.argv(), *(["--json"] if json_output else []),
            *args]
    try:
        proc = subprocess.run(argv, env=opts.environ(), stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return CommandRun(1, "", f"probe {args[0]} did not finish in {COMMAND_TIMEOUT_S:g} s; "
                                 "ask for less (a smaller --last, a LIMIT)", False)
    out, cut = _cap(proc.stdout, max_bytes)
    err, _ = _cap(proc.stderr, 8 << 10)
    return CommandRun(proc.returncode, out, err, cut)


def _cap(data: bytes, limit: int) -> tuple[str, bool]:
    if len(data) <= limit:
        return data.decode("utf-8", "replace"), False
    return data[:limit].decode("utf-8", "ignore"), True


def parse_json(run: CommandRun) -> Any:
    """The command's --json answer, or None when it printed none (or it was cut)."""
    if run.truncated or not run.stdout.strip():
        return None
    try:
        return json.loads(run.stdout)
    except ValueError:
        lines = [ln for ln in run.stdout.splitlines() if ln.strip()]
        try:  # some commands print one JSON object per line
            return [json.loads(ln) for ln in lines]
        except ValueError:
            return None
