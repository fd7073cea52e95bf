"""Ranks that never joined: an agent that is up but not in the job's rank list.

Ranks register in the job's c10d store once ``init_process_group`` has run. A rank still
before it (asleep loading data, stuck in an import) or in a rendezvous that never completes has
a running agent, answering on its own unix socket and listed by `probe ps`, that the rank list
does not name; the CLI used to call it "did not answer (not registered)". So for each rank the
list lacks, the run dirs of this machine are searched for an agent that says it is that rank of
a job like the one asked: the same world size and the same command line (torchrun starts every
rank with the same argv) and, when both serve TCP with a base port, the port the scheme gives
it (``PROBE_PORT`` + ``LOCAL_RANK``). Its socket is then asked like any rank, and the verdicts
say it never joined (``Session.unjoined``). Only this machine: a rank on another node is found
through that node's run dir (`probe -t NODE:PORT`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from probe_protocol.bodies import InfoBody
from probe_protocol.runfiles import SOCK_SUFFIX, RunFiles, pid_of

from .targets import Endpoint, local_run_dirs


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def find_unjoined(run_dir: str, me: InfoBody, missing: list[int]) -> dict[int, Endpoint]:
    """rank -> the endpoint (unix socket) of a local agent that is that rank of ``me``'s job."""
    found: dict[int, Endpoint] = {}
    want = set(missing)
    dirs = local_run_dirs(run_dir)
    if me.unix_socket:  # the asked rank's own run dir: its job's other ranks are there too
        dirs = [*local_run_dirs(os.path.dirname(me.unix_socket))[:1], *dirs]
    for d in dict.fromkeys(dirs):
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            pid = pid_of(name)
            if pid is None or name != f"{pid}{SOCK_SUFFIX}" or pid == me.pid:
                continue
            if not os.path.exists(f"/proc/{pid}"):
                continue
            info = InfoBody.from_wire(_read(RunFiles(d, pid).json))
            if info.rank not in want or info.rank in found:
                continue
            if info.world_size != me.world_size or tuple(info.argv) != tuple(me.argv):
                continue
            assert info.rank is not None
            found[info.rank] = Endpoint("http://localhost", uds=os.path.join(d, name), pid=pid)
    return found
