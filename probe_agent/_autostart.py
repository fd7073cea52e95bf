"""``PROBE=1`` auto-start, called from the ``probe_autostart.pth`` line at interpreter start-up.

The .pth line itself only reads ``os.environ`` (already imported by ``site``), so with PROBE
unset it costs one dict lookup. With PROBE set, the agent starts unless this process is one that
must not carry one:
- a launcher: torchrun / ``torch.distributed.run`` / ``torch.distributed.launch``, deepspeed's
  launcher, the probe CLI itself;
- a child of a process that already has an agent (``PROBE_AGENT_PID`` is inherited): spawned
  DataLoader workers, torch.compile's compile workers, any subprocess the rank starts.
A failure to start prints one line on stderr; the training program always runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

#: ``python -m X`` launchers and console scripts that start ranks but are not ranks.
LAUNCHER_MODULES = frozenset(
    {
        "torch.distributed.run",
        "torch.distributed.launch",
        "torch._inductor.compile_worker",
        "deepspeed.launcher.runner",
        "deepspeed.launcher.launch",
        "probe_cli",
        "pip",
    }
)
LAUNCHER_SCRIPTS = frozenset({"torchrun", "deepspeed", "probe", "pip", "pip3"})


def should_start(argv: list[str], environ: Mapping[str, str], pid: int) -> bool:
    """Whether a process with this command line and environment should carry an agent."""
    owner = environ.get("PROBE_AGENT_PID")
    if owner and owner != str(pid):
        return False
    args = argv[1:]
    if "--multiprocessing-fork" in args:
        return False
    if len(args) >= 2 and args[0] == "-m" and args[1] in LAUNCHER_MODULES:
        return False
    if len(args) >= 2 and args[0] == "-c" and "spawn_main" in args[1]:
        return False
    return not (args and os.path.basename(args[0]) in LAUNCHER_SCRIPTS)


_attempted = False


def maybe_start() -> None:
    global _attempted
    # site can process the same site-packages twice (a venv over a pyenv interpreter does):
    # only the first call may start.
    if _attempted:
        return
    _attempted = True
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if not should_start(argv, os.environ, os.getpid()):
        return
    try:
        from .agent import start

        start()
    except Exception as e:  # never keep the training program from running
        sys.stderr.write(f"probe: agent not started: {e}\n")
