"""`probe build-native`: build the tracer's C++ hot path ahead of time, for this Python and
torch, so that no rank compiles it (a cluster image runs this once at build time and ships the
cache: ``PROBE_NATIVE_DIR``, default ``~/.cache/probe/native``).

The CLI never imports the agent or torch (STYLE.md), so the build runs in the interpreter given
(``--python``, default this one) as the agent module that ranks use to build.
"""

from __future__ import annotations

import subprocess
import sys

import click

from ..errors import EXIT_FAILURE, EXIT_OK
from ..outcome import Outcome

_BUILDER = "probe_agent.collectors.tracer.native_ahead"


@click.command("build-native")
@click.option("--python", "python", default=sys.executable, show_default="this interpreter",
              help="The training environment's interpreter: the build is for its torch.")
def command(python: str) -> Outcome:
    """Build the tracer's C++ hot path now (a minute or so), so that traced steps run on it
    from the first one. Needs a C++ compiler; prints where the build is cached."""
    try:
        proc = subprocess.run([python, "-m", _BUILDER], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True)
    except OSError as e:
        return Outcome(stderr=[f"error: cannot run {python}: {e.strerror}; pass --python with "
                               f"the training environment's interpreter"], exit_code=EXIT_FAILURE)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    if proc.returncode == 0:
        return Outcome(stdout=lines[-1:], exit_code=EXIT_OK)
    return Outcome(stderr=lines[-3:] or [f"error: the build exited {proc.returncode}"],
                   exit_code=EXIT_FAILURE)
