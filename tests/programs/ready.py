"""The test programs' readiness file: ``<ready_dir>/rank{N}.json`` with the rank, the pid and,
when an agent runs in this process, its url, unix socket and rank. Written whole (tmp + rename)
so a test polling the directory never reads half a file."""

from __future__ import annotations

import json
import os


def announce(ready_dir: str | None, rank: int, **extra: object) -> None:
    if not ready_dir:
        return
    info: dict[str, object] = {"rank": rank, "pid": os.getpid(), **extra}
    try:
        from probe_agent.process import current

        agent = current()
    except ImportError:  # run without the agent installed
        agent = None
    if agent is not None:
        info.update(url=agent.url, unix_socket=agent.unix_path, agent_rank=agent.rank)
    path = os.path.join(ready_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(path + ".tmp", path)
