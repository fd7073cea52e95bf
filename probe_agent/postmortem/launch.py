"""Which run a copy belongs to when the launcher names none (torchrun's default run id "none").

Keyed on ``MASTER_ADDR-MASTER_PORT`` alone, two runs on port 29500 (or a requeued job) shared
one directory: a later run was reported with an earlier run's exception, and its clean exit
removed the earlier crash's copy. So a run without an id is named after its launch too:

- ``launched()``: when and by which process this launch started, from the launcher (the
  parent: torchrun's agent, srun's step daemon) pid and its start time in /proc. Every rank of
  one node agrees without talking; the next run differs (another process, a later time).
- ``agree(offer)``: ranks on other nodes have other launchers, and two runs started by hand
  from one shell have the same parent. So once the process group is up, each rank offers a
  name of its own process (``<addr>-<port>-<its start>-<its pid>``) under
  ``probe_agent/postmortem_job`` in the job's c10d store with ``compare_set``: the first offer
  stays, every rank reads it, and each moves its directory there (``Postmortem``). The store
  lives as long as the launch, and the winner is a process of it: the name is this run's.
  A rank that dies before the group is up keeps the launcher's name.

The value read from the store is data: it must be a name ``job_name`` could have made
(``is_job_name``), else it is ignored and the rank keeps its own directory.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from probe_protocol import postmortem as layout
from probe_protocol import runfiles

#: The key, under the agent's prefix in the job's store.
KEY = "postmortem_job"
STORE_TIMEOUT_S = 2.0


def launched(lone: bool) -> str:
    """``YYYYmmddTHHMMSS-<pid>`` of the launcher (the parent), or of this process when it is
    a lone one (``lone``: no rendezvous address)."""
    pid = os.getpid() if lone else os.getppid()
    at = runfiles.start_time(pid)
    if at is None:
        at = time.time() if lone else 0.0
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(at)) + f"-{pid}"


def job_of(environ: Mapping[str, str], pid: int) -> tuple[str, str | None]:
    """This rank's job directory name for now, and, for a run with no run id, the name it
    offers the other ranks (``agree``), else None. A process that starts with no rendezvous
    address offers too (``""``: its name is made when the group is up, ``offer_now``):
    Lightning's launcher is rank 0 itself, sets MASTER_ADDR/PORT in its own environment after
    it started, and starts the other ranks as its children, which offer theirs."""
    lone = not (environ.get("MASTER_ADDR") and environ.get("MASTER_PORT"))
    name = layout.job_name(environ, pid, launched(lone))
    if layout.run_id(environ) is not None:
        return name, None
    return name, "" if lone else layout.job_name(environ, pid, launched(lone=True))


def offer_now(offer: str, pid: int) -> str:
    """``offer``, or for a process that started alone (``""``) its name from the rendezvous
    its environment names now (``<addr>-<port>-<its start>-<its pid>``, as its peers')."""
    return offer or layout.job_name(os.environ, pid, launched(lone=True))


def agree(offer: str) -> str | None:
    """The job's agreed directory name once torch.distributed is up (``offer`` if this rank
    offered first), else None (not up yet). Raises on a store failure."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not getattr(dist, "is_initialized", lambda: False)():
        return None
    offer = offer_now(offer, os.getpid())
    store: Any = dist.distributed_c10d._get_default_store()
    base = getattr(store, "_underlying_non_prefix_store", None) or store
    try:
        base = base.clone()  # a connection of our own: a training thread's call never holds it
    except (AttributeError, RuntimeError):
        pass
    base.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
    got = dist.PrefixStore("probe_agent", base).compare_set(KEY, "", offer)
    value = bytes(got).decode("utf-8", "replace")
    return value if layout.is_job_name(value) else offer
