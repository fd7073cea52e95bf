"""What `probe inject` runs inside its target: start the agent as PROBE=1 would have.

The CLI's bootstrap file calls ``attach(overrides)`` from a ``probe-agent.attach`` thread once
the injected native thread holds the GIL. The agent then starts exactly as at launch, from the
target's environment plus the CLI's overrides (``PROBE_PORT``, ``PROBE_RUN_DIR``...); torch
tracing applies from the next step on.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def attach(overrides: dict[str, str]) -> dict[str, Any]:
    """Start the agent; the returned dict becomes the status `probe inject` prints."""
    # Imported here: this module is loaded into the target by the injector before it calls
    # attach(), and must stay cheap until then.
    from .config import AgentConfig
    from .process import start_once

    base = {"pid": os.getpid(), "python": sys.version.split()[0]}
    environ = {**os.environ, **overrides}
    agent, started = start_once(AgentConfig.from_env(environ), environ)
    return {**base, "state": "started" if started else "already", "url": agent.url,
            "unix_socket": agent.unix_path, "rank": agent.rank}
