"""docs/troubleshooting.md cannot rot: every guide entry's example runs, and every documented
probe command is run against it until it prints what the guide says it prints.

Conventions in the guide (parsed here):

- ``<!-- example: examples/NAME.py [nproc=N] [watchdog] [ARGS...] -->`` starts an entry: the
  test runs that program with PROBE=1 (under torchrun with N ranks when ``nproc`` is given),
  without the watchdog process unless ``watchdog`` is given (an entry whose commands read from
  outside the rank: a DataLoader worker's stack).
- In the entry, each ```` ```console ```` block whose first line is ``$ probe ...`` is a command
  and its real output. The ``<!-- expect: exit=N | text | text -->`` comment that follows the
  block says what the test asserts: the exit code and lines of text the output must contain.
  Each expected text must also appear in the documented output, so guide and test agree.
- ``127.0.0.1:9700`` in a command is the job's base port; the test runs the job on a free one.

Commands are retried until they match or ``WAIT_S`` passes: findings need a few steps (or, for
stalls and hangs, ``--min-wait``) to show. ``PROBE_DOC_OUT=DIR`` writes every command's real
output to DIR, to refresh the guide after a change to the output format.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import ROOT, kill_tree, python_env

pytestmark = pytest.mark.e2e

GUIDE = ROOT / "docs" / "troubleshooting.md"
WAIT_S = 120.0
_EXAMPLE = re.compile(r"<!--\s*example:\s*(.+?)\s*-->")
_EXPECT = re.compile(r"<!--\s*expect:\s*(.+?)\s*-->")


@dataclass
class Command:
    argv: list[str]
    documented: str
    exit_code: int | None = None
    texts: list[str] = field(default_factory=list)


@dataclass
class Entry:
    program: str
    nproc: int
    args: list[str]
    commands: list[Command] = field(default_factory=list)
    watchdog: bool = False

    @property
    def id(self) -> str:
        return Path(self.program).stem


def parse_guide(text: str) -> list[Entry]:
    entries: list[Entry] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := _EXAMPLE.search(line):
            words = m.group(1).split()
            nproc = next((int(w.split("=")[1]) for w in words if w.startswith("nproc=")), 0)
            rest = [w for w in words[1:] if not w.startswith("nproc=") and w != "watchdog"]
            entries.append(Entry(words[0], nproc, rest, watchdog="watchdog" in words[1:]))
        elif line.startswith("```console") and entries:
            block = []
            i += 1
            while not lines[i].startswith("```"):
                block.append(lines[i])
                i += 1
            if block and block[0].startswith("$ probe "):
                entries[-1].commands.append(
                    Command(shlex.split(block[0][2:]), "\n".join(block[1:])))
        elif (m := _EXPECT.search(line)) and entries and entries[-1].commands:
            cmd = entries[-1].commands[-1]
            for part in (p.strip() for p in m.group(1).split("|")):
                if part.startswith("exit="):
                    cmd.exit_code = int(part[5:])
                elif part:
                    cmd.texts.append(part)
        i += 1
    return entries


ENTRIES = parse_guide(GUIDE.read_text(encoding="utf-8"))


def free_base_port(n: int) -> int:
    """A port p such that p..p+n-1 were free a moment ago (torchrun ranks bind base+LOCAL_RANK)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            held = []
            for k in range(1, n):
                t = socket.socket()
                held.append(t)
                t.bind(("127.0.0.1", base + k))
            return base
        except OSError:
            continue
        finally:
            for t in held:
                t.close()
    raise AssertionError("no run of free ports")


def test_the_guide_has_an_entry_per_symptom():
    # GIVEN the symptoms issue 7 lists  THEN each has an example with a tested command
    assert {e.id for e in ENTRIES} >= {
        "cuda_oom", "ddp_hang", "nan_loss", "slow_dataloader", "memory_leak", "long_run",
        "lr_too_high", "stuck_dataloader"}
    for e in ENTRIES:
        assert (ROOT / e.program).is_file(), e.program
        assert e.commands and all(c.exit_code is not None for c in e.commands), e.id
        for c in e.commands:
            for text in c.texts:
                assert text in c.documented, f"{e.id}: {text!r} is not in the guide's output"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.id)
def test_documented_commands_find_the_problem(entry: Entry, tmp_path: Path):
    # GIVEN the entry's example running with the agent
    run_dir = tmp_path / "run"
    base = free_base_port(max(entry.nproc, 1)) if entry.nproc else 0
    env = python_env(PROBE="1", PROBE_PORT=str(base), PROBE_RUN_DIR=str(run_dir),
                     PROBE_WATCHDOG="1" if entry.watchdog else "0")
    cmd = [sys.executable]
    if entry.nproc:
        cmd += ["-m", "torch.distributed.run", f"--nproc-per-node={entry.nproc}",
                "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0"]
    cmd += [str(ROOT / entry.program), *entry.args]
    log = open(tmp_path / "example.log", "w+")
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        for c in entry.commands:
            # WHEN the documented command runs (again, until the finding has had time to show)
            argv = [a.replace("127.0.0.1:9700", f"127.0.0.1:{base}") for a in c.argv]
            deadline = time.monotonic() + WAIT_S
            while True:
                out = subprocess.run(
                    [sys.executable, "-m", "probe_cli", *argv[1:]], capture_output=True,
                    text=True, timeout=60, cwd=tmp_path,
                    env=python_env(PROBE_RUN_DIR=str(run_dir)))
                text = out.stdout + out.stderr
                if out.returncode == c.exit_code and all(t in text for t in c.texts):
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"`{shlex.join(c.argv)}` never printed {c.texts} with exit "
                                f"{c.exit_code}; last exit {out.returncode}:\n{text}\n"
                                f"--- example output ---\n{log.read()[-3000:]}")
                time.sleep(1.0)
            # THEN it says what the guide says it says
            if os.environ.get("PROBE_DOC_OUT"):
                dest = Path(os.environ["PROBE_DOC_OUT"])
                dest.mkdir(parents=True, exist_ok=True)
                n = entry.commands.index(c)
                (dest / f"{entry.id}-{n}.txt").write_text(
                    f"$ {shlex.join(c.argv)}\n{text}\n# exit {out.returncode}\n")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait(10)
        log.close()
